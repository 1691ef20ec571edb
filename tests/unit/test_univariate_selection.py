"""The univariate grouped selection (models/recipes/univariate_select.py): event counting, the
false-alarm charge per normal time, the rule replay, and that a group's held-out figure comes
from a choice that never read that group."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models" / "recipes"))

import univariate_select as sel


def test_events_alarms_and_delay_are_counted_per_labelled_run() -> None:
    labels = np.zeros(100, np.int8)
    labels[40:60] = 1
    labels[80:90] = 1
    alarms = np.zeros(100, np.int8)
    alarms[[10, 45, 50]] = 1  # one false alarm, event 1 found 5 rows in, event 2 missed
    r = sel.rate(alarms, labels, scored_from=20)
    assert (r.alarms, r.hits, r.events, r.detected) == (3, 2, 2, 1)
    assert r.false_alarms == 1 and r.normal == 80 - 30  # label-0 rows from row 20 on
    assert r.delay == pytest.approx(5 / 20)
    assert r.precision == pytest.approx(2 / 3) and r.recall == pytest.approx(0.5)
    # an event that ends inside the calibration is not counted
    assert sel.rate(alarms, labels, scored_from=70).events == 1


def test_an_event_starting_inside_the_calibration_is_rated_from_the_first_scored_row() -> None:
    """Labels on unscored rows do not enter the delay: the event is clipped to the scored rows
    (SKAB's other/2 fault starts at row 104, inside the calibration)."""
    labels = np.zeros(100, np.int8)
    labels[10:50] = 1
    alarms = np.zeros(100, np.int8)
    alarms[30] = 1
    r = sel.rate(alarms, labels, scored_from=20)
    assert (r.events, r.detected) == (1, 1)
    assert r.delay == pytest.approx((30 - 20) / (50 - 20))
    alarms[30], alarms[20] = 0, 1
    assert sel.rate(alarms, labels, scored_from=20).delay == 0.0


def _series(seed: int, shift_at: int | None) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=1200)
    lab = np.zeros(1200, np.int8)
    if shift_at is not None:
        x[shift_at : shift_at + 300] += 4.0
        lab[shift_at : shift_at + 300] = 1
    return x, lab


def test_held_out_choice_never_reads_the_held_out_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sel, "GRID", {"window": (5, 10), "rate": (0.01, 0.05),
                                      "bound": (6.0,), "threshold": (4.0, 6.0),
                                      "rule": ((5, 10), (7, 10)), "spike": (None,)})
    monkeypatch.setattr(sel, "AXES", tuple(sel.GRID))
    floors = {w: np.array([0.15, 0.03, 0.045]) for w in (5, 10)}
    series = {"a/1/x": _series(0, 600), "a/2/x": _series(1, None),
              "b/1/x": _series(2, 700), "b/2/x": _series(3, None)}
    study = sel.Study(series, floors)
    train = ["a/1/x", "a/2/x"]
    chosen = study.choose(train)
    # the same choice whatever group b's labels say
    flipped = {k: (v[0], 1 - v[1] if k.startswith("b/") else v[1]) for k, v in series.items()}
    assert sel.Study(flipped, floors).choose(train) == chosen
    lines: list[str] = []
    sel.report(study, lines.append)
    assert any(line.startswith("held-out group a") for line in lines)
    assert any(line.startswith("pooled, chosen on all") for line in lines)


def test_false_alarms_are_charged_per_normal_time() -> None:
    one = sel.Rated(alarms=3, hits=1, events=1, detected=1, delay=0.0, normal=10_000)
    assert one.fa_rate == pytest.approx(2.0)  # 2 false alarms in 10,000 normal rows
    assert one.objective == pytest.approx(1.0 - sel.FA_PENALTY * (2.0 - sel.FA_BUDGET))
    within = sel.Rated(alarms=3, hits=1, events=1, detected=1, delay=0.0, normal=20_000)
    assert within.fa_rate == pytest.approx(1.0) and within.objective == pytest.approx(1.0)


def test_time_spent_in_alarm_on_normal_rows_is_charged() -> None:
    """A stream stuck in one open episode raises one alert but is charged for its time: each
    ROWS_PER_ALARM normal rows inside an open episode count as one more false alarm."""
    stuck = sel.Rated(alarms=1, hits=0, events=0, detected=0, delay=0.0, normal=10_000,
                      open_normal=8_000)
    assert stuck.alarm_time == pytest.approx(0.8)
    assert stuck.fa_rate == pytest.approx(1 + 8_000 / sel.ROWS_PER_ALARM)
    labels = np.zeros(100, np.int8)
    labels[50:60] = 1
    alarms = np.zeros(100, np.int8)
    alarms[30] = 1
    opened = np.zeros(100, np.int8)
    opened[30:70] = 1  # open from the false alarm through the event and 10 rows after it
    r = sel.rate(alarms, labels, 20, opened)
    assert r.open_normal == 30 and r.normal == 70


def test_the_rule_replay_skips_nothing_that_matters() -> None:
    rng = np.random.default_rng(4)
    scores = rng.normal(size=3000)
    scores[[5, 700, 1500]] = np.nan
    scores[1000:1030] += 3.0
    scores[[2000, 2400]] += 6.0  # single extreme windows, for the spike path
    for rule in ((1, 1), (3, 5), (7, 10), (10, 10)):
        for spike in (None, 1.5, 3.0):
            r = sel.AlertRules(sel.RuleParams(k=rule[0], n=rule[1], spike_factor=spike))
            want = np.array([0 if np.isnan(s) else r.update(float(s), 1.5, float(i))
                             for i, s in enumerate(scores)], np.int8)
            got, opened = sel.replay_episodes(scores, 1.5, rule, spike)
            assert np.array_equal(got, want), (rule, spike)
            r = sel.AlertRules(sel.RuleParams(k=rule[0], n=rule[1], spike_factor=spike))
            active = []
            for i, s in enumerate(scores):
                if not np.isnan(s):
                    r.update(float(s), 1.5, float(i))
                active.append(int(r.active and not np.isnan(s)))
            assert np.array_equal(opened, np.array(active, np.int8)), (rule, spike)
    assert sel.replay_rules(scores, 1.5, (10, 10), 3.0)[[2000, 2400]].tolist() == [1, 1]


def _noisy_normal(seed: int) -> np.ndarray:
    """Normal operation with brief harmless blips (3 rows at +5 sigma every 500 rows)."""
    x = np.random.default_rng(seed).normal(size=6000)
    for a in range(900, 6000, 500):
        x[a : a + 3] += 5.0
    return x


def test_a_rule_that_cries_wolf_on_normal_time_is_not_chosen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sel, "GRID", {"window": (5,), "rate": (0.01,), "bound": (6.0,),
                                      "threshold": (4.0, 8.0), "rule": ((1, 1), (8, 10)),
                                      "spike": (None,)})
    monkeypatch.setattr(sel, "AXES", tuple(sel.GRID))
    floors = {5: np.array([0.15, 0.03, 0.045])}
    series = {"a/1/x": _series(0, 600), "b/1/x": _series(2, 700),
              "free/x": (_noisy_normal(5), np.zeros(6000, np.int8))}
    study = sel.Study(series, floors)
    names = sorted(series)
    loud = (5, 0.01, 6.0, 4.0, (1, 1), None)
    quiet = (5, 0.01, 6.0, 8.0, (8, 10), None)
    assert study.evaluate(loud, ["free/x"]).fa_rate > sel.FA_BUDGET
    assert study.evaluate(quiet, ["free/x"]).fa_rate <= sel.FA_BUDGET
    assert study.evaluate(quiet, names).objective > study.evaluate(loud, names).objective
    monkeypatch.setattr(sel, "FA_PENALTY", 0.0)  # without the charge the loud rule wins
    assert study.evaluate(loud, names).objective > study.evaluate(quiet, names).objective


def test_candidates_failing_the_point_anomaly_requirement_are_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """R1/R2 by injection into normal series: a 10 of 10 rule on W 5 cannot alarm on a 1-row
    spike, so only the candidates with the single-window path remain; with that path off on
    the whole grid nothing is chosen (and no package would be built)."""
    grid = {"window": (5,), "rate": (0.01,), "bound": (6.0,), "threshold": (5.0,),
            "rule": ((10, 10),), "spike": (1.0, None)}
    monkeypatch.setattr(sel, "GRID", grid)
    monkeypatch.setattr(sel, "AXES", tuple(grid))
    floors = {5: np.array([0.15, 0.03, 0.045])}
    series = {"a/1/x": _series(0, 600), "b/1/x": _series(2, 700),
              "free/x": (np.random.default_rng(5).normal(size=3000), np.zeros(3000, np.int8))}
    injected = {"free/x+inject": sel.inject(series["free/x"][0])}
    assert [k for k, _, _ in injected["free/x+inject"][1]][:3] == ["spike1", "spike3", "shift50"]
    study = sel.Study(series, floors, injected)
    off = (5, 0.01, 6.0, 5.0, (10, 10), None)
    on = (*off[:-1], 1.0)
    assert study.hit_rates(off)["spike1"] == 0.0 and not study.meets(off)
    assert study.hit_rates(on)["spike1"] >= sel.REQUIRED_HIT_RATE and study.meets(on)
    assert study.eligible == [on] and study.choose(sorted(series)) == on
    monkeypatch.setitem(grid, "spike", (None,))
    none = sel.Study(series, floors, injected)
    assert none.choose(sorted(series)) is None
    lines: list[str] = []
    assert sel.report(none, lines.append) is None
    assert any("no candidate meets R1, R2 and R3" in line for line in lines)


def test_requirement_hits_count_an_alarm_up_to_w_rows_after_the_injection() -> None:
    alarms = np.zeros(200, np.int8)
    alarms[[57, 130]] = 1
    placed = [("spike3", 50, 3), ("spike3", 100, 3), ("shift50", 120, 10)]
    # 57 < 50 + 3 + 5; nothing in [100, 108); 130 in [120, 135)
    assert sel.requirement_hits(alarms, placed, 5) == {"spike3": (1, 2), "shift50": (1, 1)}
    assert sel.requirement_hits(alarms, placed, 4)["spike3"] == (0, 2)  # 57 = 50 + 3 + 4: late


def test_a_candidate_to_diagnose_is_parsed_on_the_grid() -> None:
    c = sel.parse_candidate("5,0.01,6,5,3/5,1.5")
    assert c == (5, 0.01, 6.0, 5.0, (3, 5), 1.5)
    assert sel.parse_candidate("3,0.05,12,4,2/3,off")[-1] is None
    with pytest.raises(ValueError):
        sel.parse_candidate("5,0.01,6,5,3-5,1.5")
