"""Retraining in the cloud: a device's samples → INT8 window-statistics package → gate → sign →
registry → rollout (:mod:`fleet.training.wstat`, :mod:`fleet.training.train`,
:mod:`fleet.training.retrain`)."""
