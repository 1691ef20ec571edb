"""Alert rule defaults of a sensor stream: a univariate package brings its own.

A one-channel package (``univariate`` manifest section) carries the k of n that its grouped
selection chose (:class:`cloud_sync.manifest.UnivariateSpec` ``rule_k``, ``rule_n``;
``models/recipes/univariate_select.py``). A univariate stream whose ``[streams.rules]`` table
gives no rule key runs with that k of n and the agent's defaults for the other rule parameters
(``clear_ratio``, ``clear_windows``, ``cooldown_s``); ``benchmarks/univariate.py`` calls the same
function with an empty table, so the benchmark output shows what a deployed stream does.

A table that gives any rule key wins as a whole (its keys, and the agent's defaults for the rule
keys it leaves out), as for camera streams (:mod:`agent.services.camera_rules`). ``top_channels``
is not a rule key: setting it alone keeps the package's rule. A multichannel package has no rule
of its own: its streams take the table as given.

The single-window path (``spike_factor``, :class:`agent.pipeline.rules.RuleParams`) is its own
key: the table's when it sets it, else the package's ``rule_spike`` (whatever other rule keys
the table gives: a user who tunes k of n keeps the point-anomaly path), else off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.pipeline.rules import RuleParams

if TYPE_CHECKING:
    from agent.config.schema import RulesConfig
    from cloud_sync.manifest import UnivariateSpec

#: The ``[streams.rules]`` keys that make a table the stream's rule (``top_channels`` is not one).
RULE_KEYS = frozenset({"k", "n", "clear_ratio", "clear_windows", "cooldown_s"})


def stream_rule_params(rules: RulesConfig, univariate: UnivariateSpec | None) -> RuleParams:
    """The rules of a sensor stream (module docstring).

    Args:
        rules: The stream's ``[streams.rules]`` (``model_fields_set`` tells which keys were
            given).
        univariate: The package's ``univariate`` section, None for a multichannel package.

    Returns:
        The parameters for :class:`agent.pipeline.rules.AlertRules`.
    """
    k, n = rules.k, rules.n
    if univariate is not None and not (rules.model_fields_set & RULE_KEYS):
        k, n = univariate.rule_k, univariate.rule_n
    spike = rules.spike_factor
    if "spike_factor" not in rules.model_fields_set and univariate is not None:
        spike = univariate.rule_spike
    return RuleParams(k, n, rules.clear_ratio, rules.clear_windows, rules.cooldown_s, spike)
