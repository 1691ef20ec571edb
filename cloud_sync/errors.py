"""The exception tree of :mod:`cloud_sync` (the agent-side fleet client).

Whether a failure is worth retrying is a property of the class (``retryable``)::

    FleetError                      base of every error the client raises on purpose
    ├── FleetUnavailable            (retryable) connection refused/reset, timeout, 429, 503,
    │   │                                      any other 5xx; ``retry_after_s`` from Retry-After
    │   └── FleetDeadlineExceeded   (retryable) the call's total deadline passed (a peer that
    │                                          trickles its answer); ``deadline_s``
    ├── FleetRejected               (fatal for the batch) a 4xx: the fleet refuses this request;
    │   │                                      ``status`` and ``detail`` say why
    │   └── FleetAuthError          (retryable, slowly) 401/403: token unknown or revoked; an
    │                                          operator may re-enroll the device
    ├── FleetProtocolError          (retryable) a 200 whose body is not a valid IngestResult, or
    │   │                                      whose results do not cover every index exactly once
    │   └── AssignmentInvalid       a 200 assignment that fails the wire schema (a name that is
    │                                          not a package name, a url with ``..``, a size past
    │                                          the bound): refused whole, nothing written
    └── PackageError                (fatal) a model package (cloud_sync.package) is refused; never
        │                                  install it. ``package`` names it (path or name@version)
        ├── PackageFormatError      not a package: manifest missing/invalid, unsafe archive entry
        │                                  (../, absolute, symlink, device), too big, missing file
        ├── HashMismatch            an artefact's size or sha256 differs from the manifest
        ├── SignatureError          signature missing or malformed, key id not trusted, or the
        │                                  Ed25519 check fails (manifest or SignedRollback)
        ├── RollbackRefused         version not newer than the installed one and no valid
        │                                  SignedRollback for exactly this device/name/versions
        └── KeyFileError            a key file cannot be read or is not an Ed25519 PEM key

Nothing here imports from ``agent`` or ``fleet``.
"""

from __future__ import annotations


class FleetError(Exception):
    """Base class of every error :mod:`cloud_sync` raises on purpose.

    Attributes:
        retryable: True when the same request may succeed later unchanged.
    """

    retryable: bool = False


class FleetUnavailable(FleetError):
    """The fleet could not be reached or shed load; try again later.

    Args:
        message: What happened (no secrets).
        retry_after_s: The server's ``Retry-After`` in seconds (from delta-seconds or an
            HTTP-date), or None when it gave none.
        status: HTTP status, or None for a connection error or timeout.
    """

    retryable = True

    def __init__(
        self, message: str, retry_after_s: float | None = None, status: int | None = None
    ) -> None:
        self.retry_after_s = retry_after_s
        self.status = status
        super().__init__(message)


class FleetDownloadShort(FleetUnavailable):
    """A package download was answered but ended before the announced size (the body ended
    early or the connection broke mid-body); the part file is kept for a resume. A fleet that
    always ends short at the same byte never completes: the updater counts a resume that
    brought no new byte as a failed try (:mod:`agent.services.update_retry`)."""


class FleetDeadlineExceeded(FleetUnavailable):
    """A call did not complete within its total (wall-clock) deadline; its connection was
    closed (:mod:`cloud_sync.deadline`).

    Args:
        message: What was cut short.
        deadline_s: The total deadline, seconds.
    """

    def __init__(self, message: str, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        super().__init__(message)


class FleetRejected(FleetError):
    """The fleet refused the request with a 4xx status.

    Args:
        status: HTTP status code (400..499).
        detail: The server's explanation (JSON ``detail`` or the body's start).
    """

    def __init__(self, status: int, detail: str) -> None:
        self.status = status
        self.detail = detail
        super().__init__(f"fleet rejected the request: HTTP {status}: {detail}")


class FleetAuthError(FleetRejected):
    """401/403: the device token is missing, unknown, revoked or not allowed to write this."""

    retryable = True


class FleetProtocolError(FleetError):
    """A 200 response that breaks the wire contract (the records' fate is unknown)."""

    retryable = True


class AssignmentInvalid(FleetProtocolError):
    """A model assignment that fails :class:`cloud_sync.protocol.ModelAssignment`.

    Args:
        message: Which fields failed and why.
        raw: The response body (at most the client's response bound), for a best-effort report.
    """

    def __init__(self, message: str, raw: bytes) -> None:
        self.raw = raw
        super().__init__(message)


class PackageError(FleetError):
    """A model package failed a check and must not be installed (never retryable as is).

    Args:
        message: What failed, naming the file or field.
        package: The package's directory, archive or ``name@version``, when known.
    """

    def __init__(self, message: str, package: str | None = None) -> None:
        self.package = package
        super().__init__(f"{package}: {message}" if package else message)


class PackageFormatError(PackageError):
    """Not a valid package: bad/missing manifest, unsafe or oversize archive, missing artefact."""


class HashMismatch(PackageError):
    """An artefact's size or sha256 does not match the manifest."""


class SignatureError(PackageError):
    """Missing, malformed, untrusted or invalid Ed25519 signature (manifest or rollback)."""


class RollbackRefused(PackageError):
    """Not newer than the installed version, and no valid signed rollback allows it."""


class KeyFileError(PackageError):
    """A key file is missing, unreadable or not an Ed25519 key in PEM form."""
