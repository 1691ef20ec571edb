"""The agent's one exception tree.

Every error the agent raises on purpose derives from :class:`AgentError`. Whether an error is
worth retrying is a property of its class (``retryable``), never of the call site::

    AgentError
    ├── ConfigError                 (fatal)  invalid or unreadable configuration; exit 78
    ├── SourceError                 (retryable) an input stream failed (port vanished, file missing)
    │   ├── SourceExhausted         (fatal)  a finite source (replay) has no more data
    │   └── SourceFailed            (fatal)  an input that failed for good: a recorded file
    │                                        that does not open or holds no valid frame/row
    ├── RecordError                 (fatal for the record, never for the stream) one bad input
    │                                        record: garbage, non-numeric, non-finite, too long
    ├── ModelError                  (fatal)  a model package is missing, corrupt or fails its check
    │   └── BackendUnavailable      (fatal)  the runtime for an artefact is not installed
    ├── StoreError                  (retryable) SQLite failed (disk full, locked)
    └── PublishError                (retryable) the MQTT broker refused or is unreachable

Errors carry context (``source``, ``stream``, ``model``) as attributes and in their message, so a
log line or an ops event needs no extra formatting. Code never logs and raises the same error.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base class of every error the agent raises on purpose.

    Attributes:
        retryable: True when the same operation may succeed later (peer down, port gone).
        context: Key/value pairs naming what failed (stream, source, model, path ...).
    """

    retryable: bool = False

    def __init__(self, message: str, **context: object) -> None:
        self.context: dict[str, object] = context
        if context:
            details = ", ".join(f"{k}={v}" for k, v in context.items())
            message = f"{message} ({details})"
        super().__init__(message)


class ConfigError(AgentError):
    """The configuration is invalid; ``problems`` lists every problem as ``key.path: message``."""

    def __init__(self, message: str, problems: list[str] | None = None, **context: object) -> None:
        self.problems: list[str] = list(problems or [])
        super().__init__(message, **context)


class SourceError(AgentError):
    """An input stream failed in a way that may heal (serial port unplugged, file not yet there)."""

    retryable = True


class SourceExhausted(SourceError):
    """A finite source (a recorded file) has delivered all of its data."""

    retryable = False


class SourceFailed(SourceError):
    """An input failed for good: retrying in the process would not help (a video file that
    does not open, a camera file or folder that ended without one readable frame, a replay file
    without one valid row).

    A stream that ends with it counts as failed, not exhausted: an agent whose streams have all
    ended with at least one failed exits nonzero (``agent.exitcodes.EX_UNAVAILABLE``).
    """

    retryable = False


class RecordError(AgentError):
    """One input record was rejected; ``reason`` is a short metric label (e.g. ``non_finite``)."""

    def __init__(self, message: str, reason: str, **context: object) -> None:
        self.reason = reason
        super().__init__(message, **context)


class ModelError(AgentError):
    """A model package is missing, corrupt, or fails verification or its golden vectors."""


class BackendUnavailable(ModelError):
    """The inference runtime an artefact needs is not installed; the message names the extra."""


class StoreError(AgentError):
    """The SQLite store failed (disk full, database locked, I/O error)."""

    retryable = True


class PublishError(AgentError):
    """The MQTT broker is unreachable or refused a publish."""

    retryable = True
