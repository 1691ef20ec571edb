"""agent.services.stream_rules: which k of n a sensor stream runs."""

from __future__ import annotations

from agent.config.schema import RulesConfig
from agent.pipeline.rules import RuleParams
from agent.services.stream_rules import stream_rule_params
from cloud_sync.manifest import UnivariateSpec

SPEC = UnivariateSpec(gap_factor=5.0, scale_floor_rel=1e-3, adapt_rate=0.01, adapt_below=0.5,
                      drift_bound=3.0, rule_k=4, rule_n=6)


def test_the_package_rule_applies_only_to_a_univariate_stream_without_rule_keys() -> None:
    empty = RulesConfig()
    assert stream_rule_params(empty, SPEC) == RuleParams(4, 6, 0.9, 5, 60.0)
    assert stream_rule_params(empty, None) == RuleParams(7, 10, 0.9, 5, 60.0)  # multichannel
    only_top = RulesConfig.model_validate({"top_channels": 1})
    assert stream_rule_params(only_top, SPEC) == RuleParams(4, 6, 0.9, 5, 60.0)
    given = RulesConfig.model_validate({"clear_windows": 2})  # any rule key: the table wins
    assert stream_rule_params(given, SPEC) == RuleParams(7, 10, 0.9, 2, 60.0)


def test_the_single_window_path_is_its_own_key() -> None:
    spiky = SPEC.model_copy(update={"rule_spike": 2.0})
    assert stream_rule_params(RulesConfig(), spiky).spike_factor == 2.0
    assert stream_rule_params(RulesConfig(), SPEC).spike_factor is None  # package without one
    assert stream_rule_params(RulesConfig(), None).spike_factor is None  # multichannel: off
    # a table tuning k of n keeps the package's spike path; the key itself overrides it
    tuned = RulesConfig.model_validate({"k": 3, "n": 5})
    assert stream_rule_params(tuned, spiky) == RuleParams(3, 5, 0.9, 5, 60.0, 2.0)
    own = RulesConfig.model_validate({"spike_factor": 4.0})
    assert stream_rule_params(own, spiky) == RuleParams(4, 6, 0.9, 5, 60.0, 4.0)
    assert stream_rule_params(own, None).spike_factor == 4.0
