"""Retraining as jobs: the queue in the fleet database and the ``edge-fleet worker`` loop."""
