"""Alert rules: k-of-n debounce, hysteresis, cooldown in stream time."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from agent.pipeline.rules import AlertRules, RuleParams


def run(rules: AlertRules, scores: Sequence[float], threshold: float = 1.0, dt: float = 1.0,
        t0: float = 0.0) -> list[int]:
    """Feed ``scores`` at ts = t0, t0 + dt, ...; return the indices that raised an alert."""
    return [i for i, s in enumerate(scores) if rules.update(s, threshold, t0 + i * dt)]


def test_k_of_n_needs_k_above_within_last_n() -> None:
    p = RuleParams(k=3, n=5, clear_ratio=0.9, clear_windows=5, cooldown_s=0)
    # 2 above in any 5: never
    assert run(AlertRules(p), [2, 0, 0, 0, 2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2]) == []
    # 3 above spread over exactly 5 windows: alert on the third
    assert run(AlertRules(p), [2, 0, 2, 0, 2]) == [4]
    # 3 above spread over 6 windows: the first has left the window -> no alert
    assert run(AlertRules(p), [2, 0, 0, 2, 0, 2, 0]) == []
    # consecutive: alert on the k-th
    assert run(AlertRules(p), [0, 0, 2, 2, 2, 2, 2]) == [4]


def test_k_equals_one_alerts_on_first_exceedance() -> None:
    p = RuleParams(k=1, n=1, clear_windows=1, cooldown_s=0)
    assert run(AlertRules(p), [0.5, 1.0, 1.0001]) == [2]  # strictly above the threshold


def test_hysteresis_hovering_score_raises_one_alert() -> None:
    p = RuleParams(k=2, n=3, clear_ratio=0.9, clear_windows=3, cooldown_s=0)
    rng = np.random.default_rng(0)
    hover = (1.0 + rng.uniform(-0.08, 0.08, size=500)).tolist()  # never below 0.9 x threshold
    rules = AlertRules(p)
    assert len(run(rules, hover)) == 1
    assert rules.active


def test_episode_clears_after_clear_windows_below_ratio() -> None:
    p = RuleParams(k=1, n=1, clear_ratio=0.5, clear_windows=3, cooldown_s=0)
    r = AlertRules(p)
    # alert, then 0.6 (inside the deadband) resets the clear counter, then 3 below 0.5 clear it
    seq = [2, 0.4, 0.4, 0.6, 0.4, 0.4, 2, 0.4, 0.4, 0.4, 2]
    assert run(r, seq) == [0, 10]


def test_no_new_alert_right_after_clear_from_stale_debounce_history() -> None:
    # n > clear_windows: after the episode clears, the debounce window still remembers the
    # episode's above-threshold windows; a *below*-threshold window must not start a new episode.
    p = RuleParams(k=2, n=10, clear_ratio=0.9, clear_windows=2, cooldown_s=0)
    r = AlertRules(p)
    seq = [2.0] * 5 + [0.1] * 10
    assert run(r, seq) == [1]
    assert not r.active
    # a genuine new episode still alerts
    assert run(r, [2.0, 2.0], t0=100) == [1]


def test_cooldown_in_stream_time() -> None:
    p = RuleParams(k=1, n=1, clear_ratio=0.9, clear_windows=1, cooldown_s=60)
    r = AlertRules(p)
    assert r.update(2, 1, 1000.0)  # episode 1: alert
    assert not r.update(0, 1, 1001.0)  # cleared
    assert not r.update(2, 1, 1030.0)  # episode 2, 30 s later: suppressed by the cooldown
    assert r.active  # ... but it is an episode: staying above does not alert at 60 s either
    assert not r.update(2, 1, 1070.0)
    assert not r.update(0, 1, 1071.0)  # cleared
    assert r.update(2, 1, 1072.0)  # episode 3, 72 s after the last alert: alert
    assert not r.update(0, 1, 1073.0)
    assert not r.update(2, 1, 1131.9)  # 59.9 s: suppressed
    assert not r.update(0, 1, 1132.0)
    assert r.update(2, 1, 1132.0)  # exactly 60 s: allowed


def test_cooldown_uses_the_given_timestamps_not_the_call_count() -> None:
    p = RuleParams(k=1, n=1, clear_windows=1, cooldown_s=10)
    fast = AlertRules(p)
    slow = AlertRules(p)
    seq = [2, 0] * 15
    assert run(fast, seq, dt=0.5) == [0, 20]  # 10 s apart in stream time
    assert run(slow, seq, dt=10.0) == list(range(0, 30, 2))


def test_nan_threshold_never_alerts_and_is_not_remembered() -> None:
    p = RuleParams(k=2, n=3, clear_windows=1, cooldown_s=0)
    r = AlertRules(p)
    assert run(r, [100.0] * 50, threshold=math.nan) == []
    assert not r.active
    # calibrating windows did not count towards the debounce: k fresh windows needed
    assert not r.update(100.0, 1.0, 50.0)
    assert r.update(100.0, 1.0, 51.0)


def test_nan_score_is_not_above() -> None:
    r = AlertRules(RuleParams(k=1, n=1, clear_windows=1, cooldown_s=0))
    assert not r.update(math.nan, 1.0, 0.0)
    assert not r.active


def test_default_params_are_valid() -> None:
    p = RuleParams()
    assert (p.k, p.n) == (7, 10)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"k": 0},
        {"k": 6, "n": 5},
        {"k": 1, "n": 0},
        {"clear_ratio": 0.0},
        {"clear_ratio": 1.5},
        {"clear_windows": -1},
        {"cooldown_s": -1.0},
        {"spike_factor": 0.5},
        {"spike_factor": math.nan},
    ],
)
def test_rule_params_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RuleParams(**kwargs)  # type: ignore[arg-type]


def test_rule_params_edges_are_accepted() -> None:
    RuleParams(k=5, n=5, clear_ratio=1.0, clear_windows=1, cooldown_s=0.0)


def test_a_strided_score_stands_for_the_windows_skipped_around_it() -> None:
    """At the latency budget's skip_windows level only every 2nd window is scored: each
    verdict counts twice, so k of n keeps its meaning in stream time. Counted once, 7 of 10
    scored windows needed 14 s above the threshold in 20 s, and an 8-window episode that
    alerts at stride 1 raised nothing (a loaded tester's agent: 70 alerts became 1)."""
    p = RuleParams(k=7, n=10, clear_ratio=0.9, clear_windows=5, cooldown_s=0)
    episode = [0.0] * 20 + [2.0] * 8 + [0.0] * 20 + [2.0] * 8 + [0.0] * 10
    assert run(AlertRules(p), episode) == [26, 54]
    strided = episode[::2]
    assert run(AlertRules(p), strided, dt=2.0) == []  # each verdict counted once
    r = AlertRules(p)
    got = [i for i, s in enumerate(strided) if r.update(s, 1.0, 2.0 * i, stride=2)]
    assert got == [13, 27]  # the same two episodes (3 scored windows below cleared the first)


def test_one_noisy_scored_window_does_not_alert_a_two_window_rule_at_stride_2() -> None:
    """At the skip_windows level a scored window counts twice; a k = 2 rule must still need two
    scored windows above (stride 1 ignores one isolated exceedance, so must stride 2)."""
    params = RuleParams(k=2, n=10, clear_ratio=0.9, clear_windows=5, cooldown_s=0)
    for stride in (1, 2, 3):
        r = AlertRules(params)
        assert not any(r.update(s, 1.0, t, stride=stride)
                       for t, s in enumerate([0.5, 1.2, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]))
        r = AlertRules(params)
        assert [r.update(s, 1.0, t, stride=stride) for t, s in enumerate([0.5, 1.2, 1.3])] == [
            False, False, True]
    one = AlertRules(RuleParams(k=1, n=1, clear_ratio=1.0, clear_windows=1, cooldown_s=0))
    assert one.update(1.2, 1.0, 0.0, stride=2)  # a 1-window rule still alerts on one window


def test_the_single_window_path_alerts_on_one_extreme_window() -> None:
    """A 10 of 10 rule cannot alarm on a point anomaly (it touches W < 10 windows); one window
    above spike_factor x threshold does, once per episode and subject to the cooldown."""
    spike = [0.5] * 20 + [3.0] + [0.5] * 30 + [3.0] + [0.5] * 10
    assert run(AlertRules(RuleParams(k=10, n=10, cooldown_s=0)), spike) == []  # off by default
    rules = AlertRules(RuleParams(k=10, n=10, cooldown_s=0, spike_factor=2.0))
    assert run(rules, spike) == [20, 51]
    # above the threshold but below the spike level: k of n alone decides
    assert run(AlertRules(RuleParams(k=10, n=10, cooldown_s=0, spike_factor=2.0)),
               [0.5] * 20 + [1.9] * 5 + [0.5] * 20) == []
    # inside an episode a spike raises nothing new; the cooldown holds for the spike path too
    rules = AlertRules(RuleParams(k=3, n=5, cooldown_s=100, spike_factor=2.0))
    assert run(rules, [1.5] * 3 + [3.0] + [1.5] * 3 + [0.1] * 6 + [3.0] + [0.1] * 6) == [2]
    # the exact spike level is not above it
    assert run(AlertRules(RuleParams(k=10, n=10, cooldown_s=0, spike_factor=2.0)),
               [2.0, 0.5]) == []
