"""The user docs hold together: links resolve, the README stays short and keeps its commands,
and no development diary (sessions, testers, commit ids, profiler anecdotes) creeps back in."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "models" / "README.md",
                *(ROOT / "docs").glob("*.md")])

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")
_ANCHOR = re.compile(r'<a (?:id|name)="([^"]+)"')

#: Words of a development diary, not of a product's docs (case-insensitive).
DIARY = [
    r"\bthis session\b", r"\bsessions? ago\b", r"\bsession'?s machine\b", r"\bprevious session\b",
    r"\btesters?\b", r"\ba tester saw\b", r"\bpy-spy\b", r"\ba helper'?s?\b", r"/tmp script",
    r"\bcommit [0-9a-f]{7,40}\b",
]
#: A bare commit id: 7-40 hex digits with at least one letter and one digit, not part of a
#: longer hex run (sha256 values in examples are 64 digits).
_COMMIT_ID = re.compile(r"(?<![0-9A-Za-z])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}"
                        r"(?![0-9A-Za-z])")


def _prose(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.

    >>> slug("Aggregate parts (the agent restarted within an interval)")
    'aggregate-parts-the-agent-restarted-within-an-interval'
    >>> slug("On the gateway: `[updater]`")
    'on-the-gateway-updater'
    """
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a page defines: its headings' slugs (GitHub numbers repeats) and ``<a id>``."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    text = path.read_text(encoding="utf-8")
    for _, line in _prose(text):
        out.update(_ANCHOR.findall(line))
        match = re.match(r"^#{1,6} (.+)$", line)
        if match:
            base = slug(match.group(1))
            n = seen.get(base, 0)
            out.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return out


def relative_links(path: Path) -> list[tuple[int, str]]:
    """``(line, target)`` of every link on the page that is not a URL or a mail address."""
    out = []
    for number, line in _prose(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(line):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                out.append((number, target))
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_points_at_a_file_and_anchor_that_exist(page: Path) -> None:
    broken = []
    for number, target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{page.name}:{number}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{page.name}:{number}: {target} (no heading '#{anchor}')")
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_development_diary_in_the_docs(page: Path) -> None:
    found = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for pattern in DIARY:
            if re.search(pattern, line, re.IGNORECASE):
                found.append(f"{page.name}:{number}: {pattern}: {line.strip()[:100]}")
        for match in _COMMIT_ID.finditer(line):
            found.append(f"{page.name}:{number}: commit id {match.group(0)}: {line.strip()[:100]}")
    assert found == []


def test_the_readme_is_short_and_keeps_its_two_set_up_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    # .ci/run and the packaging check rely on these two, exactly as written.
    assert "\npython3 -m pip install -e . && edge-agent run\n" in text
    assert "\nbash .ci/run\n" in text
    assert "python3 -m pytest" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_readme_answers_what_a_wheel_user_asks_first() -> None:
    """Build the wheel, reach its commands, get the image model, log in, pick the fleet URL."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for words in ("python3 -m pip wheel --no-deps -w dist .", "~/ea/bin/activate",
                  "~/ea/bin/edge-agent", "EDGE_AGENT_MODELS_DIR=", "EDGE_FLEET_URL",
                  "edge-fleet user add me --role admin", "--password-file", "/console/"):
        assert words in text, words


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A heading: `x`\n\n[ok](#a-heading-x) [bad](missing.md) "
                    "[url](https://example.com)\n```\n[in code](nowhere.md)\n```\n"
                    "Fixed in 3eca0be as a tester saw.\n", encoding="utf-8")
    assert relative_links(page) == [(5, "#a-heading-x"), (5, "missing.md")]
    assert anchors(page) == {"title", "a-heading-x"}
    assert _COMMIT_ID.findall(page.read_text()) == ["3eca0be"]
    assert not _COMMIT_ID.findall("sha256 " + "ab12" * 16)
    assert any(re.search(p, "as a tester saw", re.IGNORECASE) for p in DIARY)
