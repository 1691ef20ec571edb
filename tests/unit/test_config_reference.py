"""docs/configuration.md is generated from the schema and must not go stale."""

from __future__ import annotations

import re
from pathlib import Path

from agent.config.reference import REFERENCE_PATH, builtin_source_configs, render
from agent.config.schema import AgentConfig

ROOT = Path(__file__).resolve().parents[2]


def test_committed_reference_is_current() -> None:
    committed = (ROOT / REFERENCE_PATH).read_text(encoding="utf-8")
    assert committed == render(), (
        f"{REFERENCE_PATH} is stale: regenerate it with "
        f"`python -m agent.config.reference > {REFERENCE_PATH}`"
    )


def test_every_key_of_every_section_and_source_kind_is_listed() -> None:
    page = render()
    for section in AgentConfig.model_fields:
        assert f"`[{section}]`" in page or f"`[[{section}]]`" in page, section
    for name in ("device_id", "budget_bytes", "calibration_max_age_s", "token_file",
                 "trusted_keys_dir", "reservoir_size", "max_inflight"):
        assert f"| `{name}` |" in page, name
    for kind, config in builtin_source_configs():
        assert f'`kind = "{kind}"`' in page, kind
        for key in config.model_fields:
            assert f"| `{key}` |" in page, (kind, key)


def test_defaults_constraints_and_required_keys_are_rendered() -> None:
    page = render()
    assert '| `device_id` | string | `"edge-demo"` | matches `^[A-Za-z0-9_.-]{1,64}$` |' in page
    assert "| `metrics_port` | integer (optional) | unset | >= 0, <= 65535 |" in page
    assert "| `name` | string | **required** |" in page
    assert '| `transport` | "tcp" \\| "rtu" | `"tcp"` |' in page


def test_no_bare_html_tag_hides_text() -> None:
    """``<device_id>`` outside a code span would vanish as an HTML tag on GitHub."""
    body = render().split("-->", 1)[1]  # after the generated-file comment
    outside_code = "".join(body.split("`")[::2])
    assert re.findall(r"<[A-Za-z/!?][^>]*>", outside_code) == []
