"""SQLite schema of the agent's store and its migrations, keyed by ``PRAGMA user_version``.

``MIGRATIONS[i]`` takes a database from ``user_version == i`` to ``i + 1``. Each step runs in
its own ``BEGIN IMMEDIATE`` transaction together with the ``user_version`` bump, so a crash or a
full disk leaves the database at the previous version, never half-migrated. Steps are append-only:
never edit a released step, add a new one.

Tables (version 1):
    alerts:     the MQTT outbox and the alert history. ``id`` order is outbox order;
                ``published_at`` is set on the broker's PUBACK; ``uploaded_at`` is reserved for the
                cloud uploader.
    aggregates: per-stream interval summaries waiting for (or done with) the cloud upload.
    counters:   named monotonic counters (per-stream alert sequence numbers) that survive restarts.

Version 2 (cloud upload):
    dead_letter: records the fleet rejected (never resent): kind, record id, the JSON body sent,
                 the fleet's reason and when (epoch seconds).
    alerts_unuploaded, aggregates_unuploaded: partial indexes over rows the fleet has not
                 acknowledged yet (the uploader's queue, oldest first).

Version 3 (calibration across restarts):
    calibrations: one row per stream, its calibration in force (:mod:`agent.store.calibrations`):
                 model name and version, ``package_sha256`` (of the manifest), ``spec_sha256`` and
                 ``spec`` (JSON of the detector settings it was fitted with), ``calibration``
                 (JSON: scaler, feature statistics, threshold), ``fitted_at`` (epoch s),
                 ``samples`` (readings fitted on) and ``readings`` (those readings, ``(N, C)``
                 little-endian float64, or NULL).

Version 4 (row ids never reused):
    alerts, aggregates: rebuilt with ``id INTEGER PRIMARY KEY AUTOINCREMENT`` (same columns,
                 rows, ids and indexes). Without AUTOINCREMENT SQLite gives a new row
                 ``max(id) + 1``, so deleting the newest row (eviction, dead letter, pruning) let
                 the next insert take its id again; consumers that remember ids across a
                 statement (the uploader's batches in flight, cleared by id when acknowledged;
                 its read cursor; the MQTT publisher's cursor) could then clear or skip a row
                 they never sent. ``sqlite_sequence`` starts at the largest id copied; ids
                 deleted above it before the migration are unknown, which is harmless: nothing
                 is in flight while a store is opened.

Version 5 (watched camera folders):
    camera_files: one row per stream and file of a watched folder already scored
                 (:mod:`agent.store.camera_files`): ``name`` (BLOB: the name's bytes relative
                 to the folder), ``size`` (bytes), ``mtime_ns`` and ``scored_at`` (epoch s).

Version 6 (camera alert snapshots):
    snapshots:  one row per camera alert with a snapshot: the frame (JPEG), the heatmap overlay
                 (PNG) and their MQTT and upload states (:mod:`agent.store.snapshots`); evicted
                 first when the store is over its budget.
Version 7 (alert lifecycle):
    episodes:    one row per stream with an episode raised and not yet cleared
                 (:mod:`agent.store.episodes`): ``episode_id``, ``peak_score``, ``reported_ts``
                 (stream time of its last report, epoch s) and ``opened_at`` (epoch s).
Version 8 (adapted baselines):
    baselines:   one row per univariate stream, its adapted robust baseline
                 (:mod:`agent.store.baselines`): the model and detector settings it belongs to
                 (as in ``calibrations``), ``calibration_sha256`` (of the calibration it started
                 from), ``baseline`` (JSON: centres and scales) and ``saved_at`` (epoch s).
"""

from __future__ import annotations

import contextlib
import sqlite3

from agent.store import snapshots

Migration = tuple[str, ...]

MIGRATIONS: tuple[Migration, ...] = (
    # 0 -> 1: initial schema.
    (
        """
        CREATE TABLE alerts (
            id           INTEGER PRIMARY KEY,
            alert_id     TEXT    NOT NULL UNIQUE,
            stream       TEXT    NOT NULL,
            seq          INTEGER NOT NULL,
            payload      TEXT    NOT NULL,
            created_at   REAL    NOT NULL,
            published_at REAL,
            uploaded_at  REAL
        )
        """,
        "CREATE INDEX alerts_pending ON alerts (id) WHERE published_at IS NULL",
        "CREATE INDEX alerts_stream ON alerts (stream, id)",
        """
        CREATE TABLE aggregates (
            id             INTEGER PRIMARY KEY,
            aggregate_id   TEXT    NOT NULL UNIQUE,
            device_id      TEXT    NOT NULL,
            stream         TEXT    NOT NULL,
            interval_start REAL    NOT NULL,
            interval_s     REAL    NOT NULL,
            count          INTEGER NOT NULL,
            channels       TEXT    NOT NULL,
            max_score      REAL,
            windows        INTEGER NOT NULL,
            alert_count    INTEGER NOT NULL,
            uploaded_at    REAL
        )
        """,
        "CREATE INDEX aggregates_stream_start ON aggregates (stream, interval_start)",
        """
        CREATE TABLE counters (
            name  TEXT    PRIMARY KEY,
            value INTEGER NOT NULL
        )
        """,
    ),
    # 1 -> 2: cloud upload (dead letters, upload queue indexes).
    (
        """
        CREATE TABLE dead_letter (
            id        INTEGER PRIMARY KEY,
            kind      TEXT    NOT NULL,
            record_id TEXT    NOT NULL,
            payload   TEXT    NOT NULL,
            reason    TEXT    NOT NULL,
            failed_at REAL    NOT NULL
        )
        """,
        "CREATE INDEX alerts_unuploaded ON alerts (id) WHERE uploaded_at IS NULL",
        "CREATE INDEX aggregates_unuploaded ON aggregates (id) WHERE uploaded_at IS NULL",
    ),
    # 2 -> 3: each stream's calibration, restored at the next start.
    (
        """
        CREATE TABLE calibrations (
            stream         TEXT    PRIMARY KEY,
            model_name     TEXT    NOT NULL,
            model_version  INTEGER NOT NULL,
            package_sha256 TEXT    NOT NULL,
            spec_sha256    TEXT    NOT NULL,
            spec           TEXT    NOT NULL,
            calibration    TEXT    NOT NULL,
            fitted_at      REAL    NOT NULL,
            samples        INTEGER NOT NULL,
            readings       BLOB
        )
        """,
    ),
    # 3 -> 4: AUTOINCREMENT ids on the two record tables (rebuild: SQLite cannot alter a key).
    (
        """
        CREATE TABLE alerts_v4 (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,
            alert_id     TEXT    NOT NULL UNIQUE,
            stream       TEXT    NOT NULL,
            seq          INTEGER NOT NULL,
            payload      TEXT    NOT NULL,
            created_at   REAL    NOT NULL,
            published_at REAL,
            uploaded_at  REAL
        )
        """,
        "INSERT INTO alerts_v4 (id, alert_id, stream, seq, payload, created_at, published_at,"
        " uploaded_at) SELECT id, alert_id, stream, seq, payload, created_at, published_at,"
        " uploaded_at FROM alerts ORDER BY id",
        "DROP TABLE alerts",
        "ALTER TABLE alerts_v4 RENAME TO alerts",
        "CREATE INDEX alerts_pending ON alerts (id) WHERE published_at IS NULL",
        "CREATE INDEX alerts_stream ON alerts (stream, id)",
        "CREATE INDEX alerts_unuploaded ON alerts (id) WHERE uploaded_at IS NULL",
        """
        CREATE TABLE aggregates_v4 (
            id             INTEGER PRIMARY KEY AUTOINCREMENT,
            aggregate_id   TEXT    NOT NULL UNIQUE,
            device_id      TEXT    NOT NULL,
            stream         TEXT    NOT NULL,
            interval_start REAL    NOT NULL,
            interval_s     REAL    NOT NULL,
            count          INTEGER NOT NULL,
            channels       TEXT    NOT NULL,
            max_score      REAL,
            windows        INTEGER NOT NULL,
            alert_count    INTEGER NOT NULL,
            uploaded_at    REAL
        )
        """,
        "INSERT INTO aggregates_v4 (id, aggregate_id, device_id, stream, interval_start,"
        " interval_s, count, channels, max_score, windows, alert_count, uploaded_at)"
        " SELECT id, aggregate_id, device_id, stream, interval_start, interval_s, count,"
        " channels, max_score, windows, alert_count, uploaded_at FROM aggregates ORDER BY id",
        "DROP TABLE aggregates",
        "ALTER TABLE aggregates_v4 RENAME TO aggregates",
        "CREATE INDEX aggregates_stream_start ON aggregates (stream, interval_start)",
        "CREATE INDEX aggregates_unuploaded ON aggregates (id) WHERE uploaded_at IS NULL",
    ),
    # 4 -> 5: the files of watched camera folders already scored.
    (
        """
        CREATE TABLE camera_files (
            stream    TEXT    NOT NULL,
            name      BLOB    NOT NULL,
            size      INTEGER NOT NULL,
            mtime_ns  INTEGER NOT NULL,
            scored_at REAL    NOT NULL,
            PRIMARY KEY (stream, name)
        )
        """,
    ),
    # 5 -> 6: camera alert snapshots.
    snapshots.MIGRATION,
    # 6 -> 7: open alert episodes, so a restart still clears them.
    (
        """
        CREATE TABLE episodes (
            stream      TEXT PRIMARY KEY,
            episode_id  TEXT NOT NULL,
            peak_score  REAL NOT NULL,
            reported_ts REAL NOT NULL,
            opened_at   REAL NOT NULL
        )
        """,
    ),
    # 7 -> 8: the adapted baseline of each univariate stream, resumed at the next start.
    (
        """
        CREATE TABLE baselines (
            stream             TEXT    PRIMARY KEY,
            model_name         TEXT    NOT NULL,
            model_version      INTEGER NOT NULL,
            package_sha256     TEXT    NOT NULL,
            spec_sha256        TEXT    NOT NULL,
            spec               TEXT    NOT NULL,
            calibration_sha256 TEXT    NOT NULL,
            baseline           TEXT    NOT NULL,
            saved_at           REAL    NOT NULL
        )
        """,
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)


def user_version(conn: sqlite3.Connection) -> int:
    """Return the database's ``PRAGMA user_version`` (0 for a new file)."""
    row = conn.execute("PRAGMA user_version").fetchone()
    return int(row[0])


def migrate(
    conn: sqlite3.Connection, migrations: tuple[Migration, ...] = MIGRATIONS
) -> tuple[int, int]:
    """Apply every pending migration step, one transaction per step.

    Args:
        conn: A connection in autocommit mode (``isolation_level=None``).
        migrations: The steps; tests may pass their own.

    Returns:
        ``(version_before, version_after)``.

    Raises:
        RuntimeError: The database is newer than this code (a downgrade); nothing is changed.
        sqlite3.Error: A step failed; that step is rolled back, earlier steps stay applied.
    """
    before = user_version(conn)
    if before > len(migrations):
        raise RuntimeError(
            f"database schema version {before} is newer than this agent's {len(migrations)}"
        )
    for version in range(before, len(migrations)):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated while we waited for the write lock.
            if user_version(conn) != version:
                conn.execute("ROLLBACK")
                continue
            for statement in migrations[version]:
                conn.execute(statement)
            # PRAGMA takes no parameters; the value is an int we computed.
            conn.execute(f"PRAGMA user_version = {version + 1:d}")
            conn.execute("COMMIT")
        except BaseException:
            # SQLite rolls a transaction back by itself on some errors (SQLITE_FULL or an I/O
            # error at COMMIT): a ROLLBACK then fails with "no transaction is active" and would
            # hide the real error (a full disk at start said "cannot rollback", not "disk full").
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
    return before, user_version(conn)
