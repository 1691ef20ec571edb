"""RetryBudget: bounded tries per assignment, exponential backoff on a fake monotonic clock."""

from __future__ import annotations

import pytest

from agent.services.update_retry import RetryBudget


def test_tries_are_bounded_and_spaced_by_a_doubling_backoff() -> None:
    now = [100.0]
    b = RetryBudget(4, 30.0, cap_s=50.0, clock=lambda: now[0])
    assert b.ready("a") and b.tried("a") == 0
    assert b.failed("a") == 30.0
    assert not b.ready("a") and b.ready("b")  # keys are independent
    now[0] = 129.9
    assert not b.ready("a")
    now[0] = 130.0
    assert b.ready("a")
    assert b.failed("a") == 50.0  # 60 s, capped
    assert b.tried("a") == 2
    now[0] = 180.0
    assert b.failed("a") == 50.0
    now[0] = 230.0
    assert b.failed("a") is None  # the 4th failed try: spent, forgotten
    assert b.ready("a") and b.tried("a") == 0


def test_forget_after_a_success_and_one_try_only() -> None:
    now = [0.0]
    b = RetryBudget(2, 10.0, clock=lambda: now[0])
    b.failed("a")
    b.forget("a")
    assert b.ready("a") and b.tried("a") == 0
    assert RetryBudget(1, 10.0).failed("x") is None
    with pytest.raises(ValueError, match="at least 1"):
        RetryBudget(0, 10.0)
