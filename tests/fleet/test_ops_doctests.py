"""The doctests of the fleet-operations modules (state rule, retention spec, HMAC signature:
the signature example is GitHub's published X-Hub-Signature-256 test vector)."""

from __future__ import annotations

import doctest
from types import ModuleType

import pytest

from fleet import notify
from fleet.db import health, retention
from fleet.registry import policy


@pytest.mark.parametrize("module", [health, retention, notify, policy], ids=lambda m: m.__name__)
def test_doctests(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
