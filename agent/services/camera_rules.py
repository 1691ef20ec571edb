"""Alert rule defaults of a camera stream (the sensor defaults are wrong for inspection).

The sensor defaults (7 of 10 windows above the threshold, a 60 s cooldown, 5 windows to clear)
debounce a noisy signal; on a camera they hid real defects: a folder of 14 images with 5
defective parts raised no alert. An inspection system reports each defective part, and a
defect seen in a video reports once while it is in view:

* **image folder** (:data:`FOLDER_RULES`): every image is a different part, so every image
  that scores above the threshold alerts (1 of 1, no episode: ``clear_windows = 0``, no
  cooldown);
* **video file or live camera** (:data:`STREAM_RULES`): one alert per run of consecutive
  frames above the threshold (1 of 1; the episode ends, and the next anomalous frame alerts
  again, after one frame below the threshold: ``clear_ratio = 1``, ``clear_windows = 1``; no
  cooldown), so a defect lingering in view does not raise an alert per frame.

A ``[streams.rules]`` table that gives any key wins as a whole, exactly as before these
defaults: its keys, and the sensor defaults for the keys it leaves out. Mixing key by key would
turn a config's ``k = 3, n = 5`` debounce into an alert per frame (the folder default
``clear_windows = 0``) instead of the one alert per episode it was written for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.pipeline.rules import RuleParams
from agent.sources.camera import CameraConfig

if TYPE_CHECKING:
    from agent.config.schema import RulesConfig

#: Rules of an image folder whose ``[streams.rules]`` gives no key.
FOLDER_RULES = RuleParams(k=1, n=1, clear_ratio=1.0, clear_windows=0, cooldown_s=0.0)
#: Rules of a video file or live camera whose ``[streams.rules]`` gives no key.
STREAM_RULES = RuleParams(k=1, n=1, clear_ratio=1.0, clear_windows=1, cooldown_s=0.0)


def camera_rule_params(rules: RulesConfig, source: CameraConfig) -> RuleParams:
    """The rules of a camera stream: the config's when it gives any key, else the camera defaults.

    Args:
        rules: The stream's ``[streams.rules]`` (``model_fields_set`` tells whether keys were
            given).
        source: The camera source (a ``folder`` gets :data:`FOLDER_RULES`, any other input
            :data:`STREAM_RULES`).

    Returns:
        The rule parameters for :class:`agent.pipeline.rules.AlertRules`.
    """
    if rules.model_fields_set:
        return RuleParams(rules.k, rules.n, rules.clear_ratio, rules.clear_windows,
                          rules.cooldown_s, rules.spike_factor)
    return FOLDER_RULES if source.folder is not None else STREAM_RULES
