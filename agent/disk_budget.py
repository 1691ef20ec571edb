"""One disk budget across everything the agent keeps on disk (``[storage] disk_budget_bytes``).

Parts (``edge_agent_disk_bytes{part}``, ``/healthz`` component ``disk``), all under
``agent.state_dir`` unless the store's path says otherwise:

=================  ==========================================  ===============================
part               what                                        when over the budget
=================  ==========================================  ===============================
``openvino_cache`` ``openvino-cache/``: compiled models        deleted first, oldest files
                                                               first (rebuilt at the next
                                                               model load, which is slower)
(snapshots)        camera alert snapshots are rows of the      inside the store: the store
                   store (agent.store.snapshots), counted in   evicts them before any
                   ``store``; :meth:`DiskBudget.add_part`      aggregate or alert
                   takes further parts
``store``          the SQLite store: database, ``-wal``,       last: its own budget is lowered
                   ``-shm`` and ``-reserve`` files             to what the other parts leave
                                                               (never below
                                                               :data:`STORE_FLOOR_BYTES` nor
                                                               above ``store.budget_bytes``)
                                                               and it evicts rows in its own
                                                               order (uploaded aggregates,
                                                               other aggregates, delivered
                                                               alerts, every other alert:
                                                               agent.store.maintenance)
``models``         ``models/``: the active package of each     never: the previous package is
                   stream, the previous one kept for a         the rollback target and must be
                   rollback, downloads in progress             on disk to be verified after a
                                                               restart; the updater deletes
                                                               older ones after each swap
=================  ==========================================  ===============================

The agent writes no log file of its own: its lines go to stderr (journald under systemd, whose
own budget is ``SystemMaxUse=`` in journald.conf(5)), so logs are not a part.

A check (every ``check_interval_s``, from the health heartbeat) measures every part (file
lengths, not allocated blocks), and when the total is above the budget deletes from the
evictable parts in the order above until the total is under ``LOW_WATER x budget``, then sets
the store's budget. When the parts that cannot be evicted (the models, the store's floor and
its fixed files) alone exceed the budget, ``disk`` is red with the figures and one ERROR line
says so (one INFO line when it is over); above ``WARN_SHARE`` of the budget it is yellow.
Without a budget every part is still measured and reported (``edge_agent_disk_budget_bytes``
is 0) and the store keeps ``store.budget_bytes``. The file system's free space joins the
verdict at every heartbeat (:mod:`agent.disk_free`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.disk_free import with_free_space
from agent.errors import StoreError
from agent.health import GREEN, RED, YELLOW, Component
from agent.logs import ALWAYS
from agent.metrics import Metrics
from agent.store.sqlite import Store

log = logging.getLogger("agent.disk")

#: Eviction stops when the total is this share of the budget (hysteresis, as the store's).
LOW_WATER = 0.9
#: Share of the budget above which ``disk`` is yellow.
WARN_SHARE = 0.9
#: The store's budget never goes below this (its minimum ``store.budget_bytes``), bytes.
STORE_FLOOR_BYTES = 1024 * 1024
#: Files next to the database that belong to the store.
STORE_SUFFIXES = ("", "-wal", "-shm", "-reserve")


class DiskPart(Protocol):
    """One part of the budget (the hook for another part, e.g. camera snapshots).

    Attributes:
        name: The ``part`` label (``snapshots``).
        evictable: Whether :meth:`evict` may delete anything.
    """

    name: str
    evictable: bool

    def used_bytes(self) -> int:
        """Bytes the part holds on disk now."""
        ...

    def evict(self, need_bytes: int) -> int:
        """Delete the part's oldest data until ``need_bytes`` are freed (or nothing is left);
        return the bytes freed. Never raises for a file that vanished meanwhile."""
        ...


def _files(root: Path) -> Iterable[tuple[Path, os.stat_result]]:
    """Every regular file under ``root`` with its stat (none when ``root`` is missing)."""
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            try:
                st = path.lstat()
            except OSError:
                continue  # deleted meanwhile
            if path.is_file() and not path.is_symlink():
                yield path, st


def tree_bytes(root: Path) -> int:
    """Sum of the lengths of the regular files under ``root`` (0 when missing), bytes."""
    return sum(st.st_size for _p, st in _files(root))


@dataclass
class DirPart:
    """A directory part: its files' lengths; evicted oldest modification time first.

    Attributes:
        name: The ``part`` label.
        root: The directory (may not exist yet).
        evictable: Whether over-budget checks may delete its files.
    """

    name: str
    root: Path
    evictable: bool = False

    def used_bytes(self) -> int:
        """Bytes of the files under :attr:`root`."""
        return tree_bytes(self.root)

    def evict(self, need_bytes: int) -> int:
        """Delete files, oldest first, until ``need_bytes`` are freed; bytes freed."""
        if not self.evictable:
            return 0
        freed = 0
        for path, st in sorted(_files(self.root), key=lambda f: f[1].st_mtime):
            if freed >= need_bytes:
                break
            try:
                path.unlink()
            except OSError:
                continue
            freed += st.st_size
        return freed


def store_file_bytes(db_path: str) -> int:
    """Bytes of the store's files: the database, ``-wal``, ``-shm`` and ``-reserve``."""
    total = 0
    for suffix in STORE_SUFFIXES:
        try:
            total += os.stat(db_path + suffix).st_size
        except OSError:
            continue
    return total


@dataclass(frozen=True)
class DiskUse:
    """One check's figures (bytes).

    Attributes:
        parts: Bytes per part, the store included.
        budget: The budget; None = none set.
        fixed: What the budget cannot evict: the non-evictable parts, the store's floor and
            its files beside the live pages.
        store_budget: The budget the store was given.
    """

    parts: dict[str, int]
    budget: int | None
    fixed: int
    store_budget: int | None

    @property
    def total(self) -> int:
        """Bytes of every part."""
        return sum(self.parts.values())


class DiskBudget:
    """Measures the parts, evicts in the documented order, sets the store's budget.

    Args:
        budget_bytes: ``storage.disk_budget_bytes``; None = measure and report only.
        store: The SQLite store (its ``budget_bytes`` is set by each check).
        parts: The other parts in eviction order (the models, the OpenVINO cache; more
            through :meth:`add_part`).
        metrics: ``disk_bytes``, ``disk_budget_bytes``, ``disk_evicted_bytes_total``.
        check_interval_s: Least seconds between two checks (:meth:`component`).
        store_floor_bytes: The least budget the store is given (tests pass a small one).
        monotonic: Monotonic clock, seconds.
    """

    def __init__(
        self,
        budget_bytes: int | None,
        store: Store,
        parts: Iterable[DiskPart],
        metrics: Metrics,
        *,
        check_interval_s: float = 60.0,
        store_floor_bytes: int = STORE_FLOOR_BYTES,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.store = store
        self.store_budget_bytes = store.budget_bytes  # the configured store.budget_bytes
        self.parts: list[DiskPart] = list(parts)
        self._metrics = metrics
        self.check_interval_s = check_interval_s
        self.store_floor_bytes = store_floor_bytes
        self._monotonic = monotonic
        self._last_check = -float("inf")
        self._over = False
        self.last: DiskUse | None = None
        self._component = Component("disk", GREEN)
        metrics.disk_budget_bytes.set(budget_bytes or 0)

    def add_part(self, part: DiskPart) -> None:
        """Add a part, evicted after the ones already given and before the store (the hook
        of the camera snapshots: ``add_part(snapshot_part)``)."""
        self.parts.append(part)

    def check(self) -> DiskUse:
        """Measure, evict when over the budget, and set the store's budget (never raises for
        a store failure: the store is then measured from its files only)."""
        used = {p.name: p.used_bytes() for p in self.parts}
        store_disk = store_file_bytes(self.store.path)
        try:
            live = self.store.size_bytes()
        except StoreError:
            live = store_disk
        overhead = max(0, store_disk - live)  # freelist pages, -shm, -reserve
        budget = self.budget_bytes
        if budget is not None and sum(used.values()) + store_disk > budget:
            need = sum(used.values()) + store_disk - int(budget * LOW_WATER)
            for part in self.parts:
                if need <= 0:
                    break
                if not part.evictable or used[part.name] == 0:
                    continue
                freed = part.evict(need)
                if freed:
                    self._metrics.disk_evicted_bytes_total.labels(part=part.name).inc(freed)
                    log.warning("disk budget %d bytes exceeded: deleted %d bytes of %s",
                                budget, freed, part.name, extra={"part": part.name})
                need -= freed
                used[part.name] = part.used_bytes()
        fixed = sum(used[p.name] for p in self.parts if not p.evictable) + overhead
        store_budget = self.store_budget_bytes
        if budget is not None:
            share = budget - sum(used.values()) - overhead  # the store's live bytes
            store_budget = max(self.store_floor_bytes, share if store_budget is None
                               else min(store_budget, share))
            if store_budget != self.store.budget_bytes:
                self.store.budget_bytes = store_budget
            if live > store_budget:
                try:
                    self.store.enforce_budget()
                    store_disk = store_file_bytes(self.store.path)
                except StoreError as exc:
                    log.error("disk budget: the store could not evict: %s", exc)
        used["store"] = store_disk
        use = DiskUse(used, budget, fixed + self.store_floor_bytes, store_budget)
        for name, value in used.items():
            self._metrics.disk_bytes.labels(part=name).set(value)
        self.last = use
        return use

    def component(self) -> Component:
        """The ``disk`` health component, checking first when ``check_interval_s`` passed;
        with the free space of the store's file system at every call
        (:func:`agent.disk_free.with_free_space`: red while the store cannot write for lack of
        space, yellow when the space is low)."""
        now = self._monotonic()
        if now - self._last_check >= self.check_interval_s:
            self._last_check = now
            self._component = self._judge(self.check())
        directory = os.path.dirname(os.path.abspath(self.store.path))
        return with_free_space(self._component, directory, self.store.failure(), now)

    def _judge(self, use: DiskUse) -> Component:
        details: dict[str, object] = {
            "budget_bytes": use.budget, "used_bytes": use.total, "parts": dict(use.parts),
        }
        if use.store_budget is not None:
            details["store_budget_bytes"] = use.store_budget
        if use.budget is None:
            return Component("disk", GREEN, None, details)
        if use.fixed > use.budget:
            reason = (
                f"the parts that cannot be evicted need {use.fixed} bytes, more than the "
                f"disk budget of {use.budget} bytes ({_figures(use)}, store floor "
                f"{self.store_floor_bytes}): raise storage.disk_budget_bytes or remove models"
            )
            if not self._over:
                self._over = True
                log.error("disk budget: %s", reason, extra=ALWAYS)
            return Component("disk", RED, reason, details)
        if self._over:
            self._over = False
            log.info("disk budget: the parts that cannot be evicted fit in %d bytes again",
                     use.budget, extra=ALWAYS)
        if use.total > WARN_SHARE * use.budget:
            reason = (f"disk at {100 * use.total / use.budget:.0f}% of its {use.budget} byte "
                      f"budget ({_figures(use)})")
            return Component("disk", YELLOW, reason, details)
        return Component("disk", GREEN, None, details)


def _figures(use: DiskUse) -> str:
    """``store 1200, models 300`` (bytes per part, largest first)."""
    return ", ".join(f"{k} {v}" for k, v in sorted(use.parts.items(), key=lambda kv: -kv[1]))


def default_parts(state_dir: Path) -> list[DiskPart]:
    """The parts besides the store under ``state_dir``, in eviction order: the OpenVINO cache
    (evictable), the models (never evicted)."""
    return [DirPart("openvino_cache", state_dir / "openvino-cache", evictable=True),
            DirPart("models", state_dir / "models", evictable=False)]
