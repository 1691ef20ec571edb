"""The grouped SKAB selection's report (:mod:`skab_select`): per family and per kind of
candidate, each group held out, leave files out, the pooled choice and the spread over its
neighbourhood; then the choice among all families and the shipped defaults.

Every figure is printed beside the candidate that produced it and the files that chose it. The
``shippable`` rows run the procedure the shipped defaults come from (the choice among the
:data:`skab_select.SHIPPABLE` families' :data:`skab_select.SHIPPABLE_KINDS`) with each group,
and each fold of files, held out: those are the held-out figures of what ships.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import skab_select as sel
from skab_select import Candidate
from skab_study import Study

#: (label, family or families, kind or kinds) of one report block; None: any.
Row = tuple[str, str | tuple[str, ...] | None, str | tuple[str, ...] | None]


def describe(c: Candidate) -> str:
    """One line naming every axis of ``c``."""
    par = {"wstat": "top_k", "pca": "var", "mset": "memory"}[sel.detector_of(c.detector)]
    rule = (f"factor={c.factor:g}" if c.rule == "max"
            else f"POT init={c.init:g} q={c.q:g}")
    var = (" robust" if c.robust else "") + (
        f" adapt={c.adapt_rate:g} bound={c.drift_bound:g}" if c.adapt_rate else "")
    return (f"{c.detector} W={c.window} {par}={c.param:g} holdout={c.holdout:g} "
            f"{rule} floor={c.floor:g}{var}")


def report(study: Study, families: Sequence[str], log: Callable[[str], None] = print
           ) -> Candidate:
    """Print the side-by-side grouped figures per family and overall; returns the choice among
    the :data:`skab_select.SHIPPABLE` families' :data:`skab_select.SHIPPABLE_KINDS` (the
    shipped defaults).

    Raises:
        ValueError: ``families`` holds no shippable family.
    """
    names = sorted(study.files)
    log("F1 / FAR % / MAR %, pooled rows")
    for label, fam, rule in report_rows(families):
        lgo = study.leave_group_out(fam, rule)
        for g, (c, f) in lgo.items():
            log(f"{label:<11} held-out group {g:<7} {f.text()}   chosen on the other: "
                f"{describe(c)}")
            # the spread around the point chosen on the other group, on this group's files: a
            # spread around a point picked on the files it is read on would flatter the point
            log(f"{label:<11} held-out group {g:<7} {spread_text(study, c, group_names(names, g))}")
            log(f"{label:<11} held-out group {g:<7} requirements: "
                f"{requirement_text(study, c, [n for n in names if n.split('/')[0] != g])}; "
                f"on this group {study.checks(c, group_names(names, g)).text()}")
        for g, f in study.leave_files_out(family=fam, rule=rule).items():
            log(f"{label:<11} leave files out {g:<6} {f.text()}")
        pooled_c = study.choose(names, fam, rule)
        log(f"{label:<11} pooled, chosen on all {study.evaluate(pooled_c, names).text()}   "
            f"{describe(pooled_c)}")
        log(f"{label:<11} pooled, requirements: {requirement_text(study, pooled_c, names)}")
    overall = study.choose(names)
    log(f"chosen among all families: {describe(overall)}")
    ship = [f for f in families if f in sel.SHIPPABLE]
    if not ship:
        raise ValueError(f"no shippable family among {families} (shippable: {sel.SHIPPABLE})")
    if overall.detector in sel.SHIPPABLE and overall.kind in sel.SHIPPABLE_KINDS:
        choice = overall
    else:
        pairs = [(f, k) for f in ship for k in sel.SHIPPABLE_KINDS if k in kinds_of(f)]
        choice = max((study.choose(names, f, k) for f, k in pairs),
                     key=lambda c: study.rank(c, study.group_files(names)))
    log(f"chosen among shippable candidates ({', '.join(sel.SHIPPABLE)}; "
        f"{', '.join(sel.SHIPPABLE_KINDS)}): {describe(choice)}")
    log(f"its requirements: {requirement_text(study, choice, names)}")
    log(f"pooled (chosen on the same files) {spread_text(study, choice, names)}")
    return choice


def kinds_of(family: str) -> list[str]:
    """The :attr:`Candidate.kind` values ``family``'s grid holds, in report order."""
    g = sel.GRID[family]
    kinds = {Candidate(family, 1, 1, 0, 1, 0, "max", 0, 0, *v).kind for v in sel.variants(family)}
    if all(a in g for a in ("q", "init")):
        kinds.add("pot")
    return [k for k in ("max", "pot", "adapt", "robust", "robust+adapt") if k in kinds]


def report_rows(families: Sequence[str]) -> list[Row]:
    """(label, family, kind) of each block of :func:`report`: per family each kind its grid
    has (``wstat/max``, ``wstat/pot``, ``wstat-drift/adapt``, ``wstat-drift/robust``,
    ``wstat-drift/robust+adapt``) side by side, then the family with any kind; then, when
    several shippable kinds are studied, the ``shippable`` block (the procedure that picks the
    shipped defaults); then any family (when there are several)."""
    rows: list[Row] = []
    for fam in families:
        kinds = kinds_of(fam)
        if len(kinds) > 1:
            rows += [(f"{fam}/{k}", fam, k) for k in kinds]
        rows.append((fam, fam, None))
    ship = tuple(f for f in families if f in sel.SHIPPABLE)
    pairs = [(f, k) for f in ship for k in kinds_of(f) if k in sel.SHIPPABLE_KINDS]
    if len(pairs) > 1:
        rows.append(("shippable", ship, tuple(sel.SHIPPABLE_KINDS)))
    if len(families) > 1:
        rows.append(("any family", None, None))
    return rows


def requirement_text(study: Study, c: Candidate, fit: Sequence[str]) -> str:
    """Whether ``c`` meets each requirement on every group of its fit files ``fit`` (as the
    choice ranks it), with the checks pooled over them."""
    ramp, outlier = study.met(c, study.group_files(fit))
    verdict = ", ".join(f"{name} {'met' if ok else 'FAILED'}"
                        for name, ok in zip(sel.REQUIREMENTS, (ramp, outlier), strict=True))
    return f"{verdict} on the fit files ({study.checks(c, fit).text()})"


def group_names(names: Iterable[str], group: str) -> list[str]:
    """The files of ``group`` among ``names``."""
    return [n for n in names if n.startswith(group + "/")]


def spread_text(study: Study, c: Candidate, names: Sequence[str]) -> str:
    """``neighbourhood (k points) F1 a..b FAR c..d MAR e..f`` of ``c`` on ``names``."""
    worst, best = study.spread(c, names)
    return (f"neighbourhood ({len(study.neighbours(c))} points) F1 {worst.f1:.3f}..{best.f1:.3f} "
            f"FAR {best.far:.2f}..{worst.far:.2f} MAR {best.mar:.2f}..{worst.mar:.2f}")
