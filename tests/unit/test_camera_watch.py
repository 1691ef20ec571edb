"""A watched image folder (``watch = true``): images dropped in while the agent runs are scored,
a file still being written waits until it is stable, and after a restart (also one that never
marked its last file, as a ``kill -9`` would leave it) only new files are scored. Real files,
the real source, store and agent; the model is the shipped ``mtd-patchcore`` package."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from agent.app import Agent  # noqa: E402
from agent.cli import EX_CONFIG, main  # noqa: E402
from agent.config.loader import parse_config  # noqa: E402
from agent.errors import ConfigError, SourceExhausted  # noqa: E402
from agent.metrics import Metrics  # noqa: E402
from agent.preflight import preflight  # noqa: E402
from agent.records import Frame  # noqa: E402
from agent.sources.camera import CameraConfig, CameraSource  # noqa: E402
from agent.sources.camera_watch import (  # noqa: E402
    FORGET_AFTER_S,
    IDLE,
    FolderCheckpoint,
    WatchFolderCapture,
)
from agent.store.sqlite import Store  # noqa: E402
from agent.systemd import Notifier  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "models" / "mtd-patchcore"


def _wait(cond: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _png(level: int, size: int = 32) -> bytes:
    ok, buf = cv2.imencode(".png", np.full((size, size), level, np.uint8))
    assert ok
    return bytes(buf)


def _drop(folder: Path, name: str, data: bytes) -> None:
    """Write like a camera that renames a finished file into the folder."""
    tmp = folder.parent / f".{name}.part"
    tmp.write_bytes(data)
    os.replace(tmp, folder / name)


class _Running:
    """A watched-folder source running in a thread; marks each scored frame at once."""

    def __init__(self, folder: Path, store: Store | None, stream: str = "cam",
                 status: Callable[[object], None] | None = None) -> None:
        cp = FolderCheckpoint(stream, store)
        self.src = CameraSource(CameraConfig(folder=str(folder), watch=True, poll_s=0.05),
                                stream, checkpoint=cp)
        if status is not None:  # before the thread starts: its first poll may report at once
            self.src.set_status_listener(status)
        self.frames: list[Frame] = []
        self.rejected: list[object] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _emit(self, frame: Frame) -> None:
        self.frames.append(frame)
        mark = self.src.scored_file(frame)
        assert mark is not None
        mark.commit()

    def _run(self) -> None:
        try:
            self.src.run(self._emit, self.rejected.append, self.stop)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def names(self) -> list[str]:
        return [f.origin.file for f in self.frames if f.origin is not None]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        assert not self.thread.is_alive() and self.error is None


def test_files_dropped_in_while_running_are_scored_once_in_name_order(tmp_path: Path) -> None:
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in (1, 0):
        _drop(folder, f"{i:02d}.png", _png(40 + i))
    run = _Running(folder, None)
    try:
        assert _wait(lambda: len(run.frames) == 2)
        assert run.names() == ["00.png", "01.png"]
        time.sleep(0.3)  # several polls: nothing is read again
        assert len(run.frames) == 2
        for i in (3, 2):  # later files, one written with another suffix case
            _drop(folder, f"{i:02d}.PNG" if i == 3 else f"{i:02d}.png", _png(60 + i))
        (folder / "notes.txt").write_text("ignored")
        (folder / "04.png").write_bytes(b"\x89PNG garbage")
        assert _wait(lambda: len(run.frames) == 4 and len(run.rejected) == 1)
        assert run.names() == ["00.png", "01.png", "02.png", "03.PNG"]
        time.sleep(0.3)
        assert len(run.frames) == 4 and len(run.rejected) == 1  # the bad file: said once
        assert run.thread.is_alive()  # never ends by itself
    finally:
        run.close()
    assert run.src.rejected == 1 and run.src.dropped == 0


def test_a_folder_that_cannot_be_listed_is_an_outage_not_idle_polls(tmp_path: Path) -> None:
    """A watched folder gone (a share unmounted) kept the stream green in /healthz: its failed
    polls counted as idle progress. It is an outage now (status listener: one error when it
    starts, None when the folder lists again) and idle_mono stands still meanwhile."""
    folder = tmp_path / "frames"
    folder.mkdir()
    _drop(folder, "00.png", _png(40))
    run = _Running(folder, None)
    events: list[object] = []
    run.src.set_status_listener(events.append)
    try:
        assert _wait(lambda: len(run.frames) == 1 and run.src.idle_mono is not None)
        folder.rename(tmp_path / "away")
        assert _wait(lambda: len(events) == 1)
        assert "cannot be listed" in str(events[0])
        idle = run.src.idle_mono
        time.sleep(0.3)  # several failed polls
        assert run.src.idle_mono == idle and len(events) == 1
        (tmp_path / "away").rename(folder)
        assert _wait(lambda: len(events) == 2)
        assert events[1] is None
        assert _wait(lambda: run.src.idle_mono is not None and run.src.idle_mono > (idle or 0))
        assert run.names() == ["00.png"]  # nothing scored again
    finally:
        run.close()


def test_a_file_being_written_is_taken_only_once_unchanged_over_one_poll(tmp_path: Path) -> None:
    data = _png(90, size=64)
    part = tmp_path / "a.png"
    part.write_bytes(data[:40])
    cp = FolderCheckpoint("cam")
    cap = WatchFolderCapture(tmp_path, cp)
    assert cap.read() == (True, IDLE)  # first seen
    for end in (80, 120, len(data)):  # grows between every two polls
        with part.open("ab") as f:
            f.write(data[part.stat().st_size:end])
        assert cap.read() == (True, IDLE)
    ok, img = cap.read()  # unchanged over one poll: taken
    assert ok and isinstance(img, np.ndarray) and img.shape == (64, 64)
    assert cap.origin is not None and cap.origin.file == "a.png"
    cp.done("a.png")
    assert cap.read() == (True, IDLE) and cap.read() == (True, IDLE)  # scored once
    # rewritten in place (another size and mtime): a new image under the same name
    part.write_bytes(_png(10, size=48))
    assert cap.read() == (True, IDLE)
    ok, img = cap.read()
    assert ok and isinstance(img, np.ndarray) and img.shape == (48, 48)


def test_restart_skips_scored_files_and_reads_the_unmarked_one_again(tmp_path: Path) -> None:
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(3):
        _drop(folder, f"{i:02d}.png", _png(30 + i))
    store = Store(tmp_path / "agent.db", time.time)
    run = _Running(folder, store)
    try:
        assert _wait(lambda: len(run.frames) == 3)
    finally:
        run.close()
    store.close()
    # a crash between scoring 03.png and marking it: taken, never marked
    store = Store(tmp_path / "agent.db", time.time)
    assert sorted(store.scored_files("cam")) == ["00.png", "01.png", "02.png"]
    _drop(folder, "03.png", _png(50))
    cp = FolderCheckpoint("cam", store)
    cap = WatchFolderCapture(folder, cp)
    assert cap.read() == (True, IDLE)
    ok, _ = cap.read()
    assert ok and cap.origin is not None and cap.origin.file == "03.png"
    store.close()  # "kill -9": no mark
    _drop(folder, "04.png", _png(60))
    store = Store(tmp_path / "agent.db", time.time)
    run = _Running(folder, store)
    try:
        assert _wait(lambda: len(run.frames) == 2)
        time.sleep(0.3)
        assert run.names() == ["03.png", "04.png"]  # at least once: 03 again, 00-02 never
    finally:
        run.close()
    assert len(store.scored_files("cam")) == 5
    assert store.scored_files("other") == {}
    store.close()


def test_checkpoint_forgets_files_gone_from_the_folder_and_keeps_odd_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent.sources.camera_watch.PRUNE_EVERY_POLLS", 2)
    odd = os.fsdecode(b"good_\xff.png")
    for name in ("a.png", "b.png", odd):
        (tmp_path / name).write_bytes(_png(70))
    store = Store(tmp_path / "agent.db", time.time)
    now = [0.0]
    cp = FolderCheckpoint("cam", store, clock=lambda: now[0])
    cap = WatchFolderCapture(tmp_path, cp)
    assert cap.read() == (True, IDLE)
    for _ in range(3):
        ok, img = cap.read()
        assert ok and isinstance(img, np.ndarray) and cap.origin is not None
        cp.done(cap.origin.file)
    assert set(store.scored_files("cam")) == {"a.png", "b.png", odd}
    (tmp_path / "a.png").unlink()
    for _ in range(4):
        assert cap.read() == (True, IDLE)
    assert len(store.scored_files("cam")) == 3  # missing, but not for a day yet
    now[0] = FORGET_AFTER_S
    for _ in range(4):
        assert cap.read() == (True, IDLE)
    assert set(store.scored_files("cam")) == {"b.png", odd} and len(cp) == 2
    for p in tmp_path.glob("*.png"):  # an empty listing (an unmounted share) forgets nothing
        p.unlink()
    for _ in range(4):
        assert cap.read() == (True, IDLE)
    assert len(store.scored_files("cam")) == 2
    store.close()


def test_without_watch_a_folder_is_read_once_as_before(tmp_path: Path) -> None:
    (tmp_path / "00.png").write_bytes(_png(40))
    src = CameraSource(CameraConfig(folder=str(tmp_path)), "cam")
    assert src.checkpoint is None
    frames: list[Frame] = []
    with pytest.raises(SourceExhausted):
        src.run(frames.append, lambda e: None, threading.Event())
    assert len(frames) == 1 and src.scored_file(frames[0]) is None


def _good_and_cracked(folder: Path, names: range, cracked: set[int]) -> None:
    m = json.loads((PACKAGE / "manifest.json").read_text())["input"]
    g = np.load(PACKAGE / "golden.npy")
    good = [np.clip(np.round((x[0] * m["std"][0] + m["mean"][0]) * 255), 0, 255)
            .astype(np.uint8) for x in g]
    for i in names:
        img = good[i % len(good)].copy()
        if i in cracked:
            pts = np.array([[60, 20], [75, 70], [70, 120], [85, 170]], np.int32)
            cv2.polylines(img, [pts], False, 15, 2)
        ok, buf = cv2.imencode(".png", img)
        assert ok
        _drop(folder, f"{i:03d}.png", bytes(buf))


def _agent_config(tmp_path: Path) -> str:
    return f"""
[agent]
device_id = "gw1"
state_dir = "{tmp_path / 'state'}"
console_alerts = false
[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
folder = "{tmp_path / 'frames'}"
watch = true
poll_s = 0.05
"""


def _run_agent(tmp_path: Path, until: Any) -> Agent:
    agent = Agent(parse_config(_agent_config(tmp_path), env={}), Metrics(), console=None,
                  notifier=Notifier(""))
    codes: list[int] = []
    t = threading.Thread(target=lambda: codes.append(agent.run()), daemon=True)
    t.start()
    try:
        assert _wait(lambda: until(agent), 60)
        time.sleep(0.3)  # more polls: nothing else is scored
    finally:
        agent.request_stop("test")
        t.join(30)
    assert codes == [0]
    return agent


def _alert_files(tmp_path: Path) -> list[str]:
    db = sqlite3.connect(tmp_path / "state" / "agent.db")
    try:
        return [json.loads(p)["source"]["file"]
                for (p,) in db.execute("select payload from alerts order by id")]
    finally:
        db.close()


def test_agent_restart_scores_only_new_files_and_repeats_no_alert(tmp_path: Path) -> None:
    folder = tmp_path / "frames"
    folder.mkdir()
    _good_and_cracked(folder, range(4), {2, 3})
    first = _run_agent(tmp_path, lambda a: a.cameras["cam1"].scored == 4)
    assert first.cameras["cam1"].scored == 4
    assert _alert_files(tmp_path) == ["002.png", "003.png"]
    health = first.monitor.report().to_json()["components"]
    assert isinstance(health, dict) and "source:cam1" in health

    def later(agent: Agent) -> bool:  # files dropped in after the start
        if agent.cameras["cam1"].source.idle_mono is not None and not (folder / "005.png").exists():
            _good_and_cracked(folder, range(4, 6), {5})
        return agent.cameras["cam1"].scored == 2

    second = _run_agent(tmp_path, later)
    assert second.cameras["cam1"].scored == 2
    assert _alert_files(tmp_path) == ["002.png", "003.png", "005.png"]
    db = sqlite3.connect(tmp_path / "state" / "agent.db")
    assert db.execute("select count(*) from camera_files where stream = 'cam1'").fetchone() == (6,)
    db.close()


CAMERA = """
[agent]
state_dir = "{state}"
[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
{source}
"""


@pytest.mark.parametrize(("source", "key"), [
    ('device = 0\nwatch = true', "watch"),
    ('path = "line1.avi"\npoll_s = 2.0', "poll_s"),
    ('url = "rtsp://cam/1"\nwatch = false', "watch"),
    ('folder = "frames"\nwatch = true\nloop = true', "loop"),
    ('folder = "frames"\nwatch = true\nfps = 5.0', "fps"),
    ('folder = "frames"\nwatch = true\npoll_s = 0', "poll_s"),
    # passed, then the grabber thread died on Event.wait(inf) (OverflowError): no file scored
    ('folder = "frames"\nwatch = true\npoll_s = inf', "poll_s"),
    ('folder = "frames"\nwatch = true\npoll_s = 1e300', "poll_s"),
])
def test_watch_keys_outside_a_folder_are_config_problems_at_their_path(
        tmp_path: Path, source: str, key: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = CAMERA.format(state=tmp_path / "state", source=source)
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    assert [p.split(": ", 1)[0] for p in info.value.problems] == [f"streams[0].source.{key}"]
    path = tmp_path / "agent.toml"
    path.write_text(text)
    assert main(["check-config", str(path)]) == EX_CONFIG
    assert f"streams[0].source.{key}" in capsys.readouterr().err
    assert main(["run", "--config", str(path)]) == EX_CONFIG


def test_watch_and_poll_s_on_a_folder_are_valid(tmp_path: Path) -> None:
    text = CAMERA.format(state=tmp_path / "state",
                         source='folder = "frames"\nwatch = true\npoll_s = 0.5')
    source = parse_config(text, env={}).streams[0].source
    assert isinstance(source, CameraConfig) and source.watch and source.poll_s == 0.5
    assert not source.finite and not source.realtime


def test_a_share_hidden_by_a_mount_with_one_image_is_not_scored_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tester mounted an empty file system over a watched folder of scored files and put one
    image in it: after 60 polls every entry was forgotten and, once unmounted, 3,082 of 3,210
    files were scored again. Entries now survive an absence shorter than FORGET_AFTER_S."""
    monkeypatch.setattr("agent.sources.camera_watch.PRUNE_EVERY_POLLS", 2)
    share = tmp_path / "share"
    share.mkdir()
    for i in range(5):
        (share / f"{i}.png").write_bytes(_png(20 + i))
    now = [0.0]
    cp = FolderCheckpoint("cam", None, clock=lambda: now[0])
    cap = WatchFolderCapture(share, cp)
    assert cap.read() == (True, IDLE)
    for _ in range(5):
        ok, _ = cap.read()
        assert ok and cap.origin is not None
        cp.done(cap.origin.file)
    hidden = tmp_path / "hidden"
    share.rename(hidden)  # "mount" an empty file system with one new image over it
    share.mkdir()
    (share / "new.png").write_bytes(_png(99))
    for _ in range(10):
        now[0] += 600.0  # 100 minutes in all
        ok, img = cap.read()
        if ok and img is not IDLE and cap.origin is not None:
            cp.done(cap.origin.file)
    assert len(cp) == 6
    (share / "new.png").rename(hidden / "new.png")  # "unmount": the old files are back
    share.rmdir()
    hidden.rename(share)
    for _ in range(6):
        assert cap.read() == (True, IDLE)  # nothing scored again


def test_a_watched_folder_missing_at_start_is_an_outage_until_it_appears(tmp_path: Path) -> None:
    """A share mounted after the agent starts: the start used to fail with exit 78, which the
    unit's RestartPreventExitStatus keeps down for good (every stream with it). Now the polls
    fail as an outage until the folder can be listed, and preflight does not object."""
    folder = tmp_path / "share"
    config = parse_config(f"""
[agent]
device_id = "gw1"
state_dir = "{tmp_path / 'state'}"
[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
folder = "{folder}"
watch = true
""", env={})
    assert preflight(config.resolved(tmp_path)) == []
    events: list[object] = []
    run = _Running(folder, None, status=events.append)
    try:
        assert _wait(lambda: len(events) == 1)
        assert "cannot be listed" in str(events[0]) and run.error is None
        folder.mkdir()
        _drop(folder, "00.png", _png(40))
        assert _wait(lambda: len(run.frames) == 1)
        assert events[-1] is None and run.names() == ["00.png"]
    finally:
        run.close()
