"""The fleet service's exception tree.

::

    FleetError                      base of everything raised on purpose by fleet/
    ├── ConfigError                 bad settings, DB URL, token file (CLI exit 78, EX_CONFIG)
    ├── StorageError                the database failed
    │   ├── StorageUnavailable      unreachable / overloaded: retryable (HTTP 503 + Retry-After)
    │   └── MigrationError          schema migration failed: fatal
    ├── JobError                    a retraining job was given up by this worker (fleet.jobs)
    │   ├── LeaseLost               another worker holds the job now: stop, publish nothing
    │   └── JobInterrupted          time limit reached or the worker is stopping (SIGTERM)
    └── ApiError                    an HTTP request is refused (status + JSON body)
        ├── BadRequest              400 malformed body (not JSON, broken gzip)
        ├── Unauthorized            401 missing or unknown token
        ├── Forbidden               403 token valid but not for this resource
        ├── NotFound                404
        ├── Conflict                409 (device already enrolled)
        ├── PayloadTooLarge         413 body or batch over the limits of cloud_sync.protocol
        ├── UnsupportedMediaType    415 wrong Content-Type or Content-Encoding
        ├── Unprocessable           422 schema violation of the envelope or a query parameter
        ├── TooManyRequests         429 login attempts too fast (``Retry-After``)
        └── CorruptArchive          500 a stored model archive fails its recorded sha256

``retryable`` is a class property: clients may retry only what says so. API errors render as
``{"error": <code>, "detail": <text or list>}`` (see :mod:`fleet.api.handlers`).
"""

from __future__ import annotations

from typing import Any, ClassVar


class FleetError(Exception):
    """Base of every error the fleet raises on purpose."""

    retryable: ClassVar[bool] = False


class ConfigError(FleetError):
    """Invalid configuration: the CLI exits 78 (EX_CONFIG)."""


class StorageError(FleetError):
    """The database failed."""


class StorageUnavailable(StorageError):
    """The database is unreachable or overloaded; retry after ``retry_after_s`` seconds."""

    retryable: ClassVar[bool] = True

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class MigrationError(StorageError):
    """A schema migration failed."""


class JobError(FleetError):
    """A retraining job was given up by the worker running it.

    Args:
        message: What happened.
        job_id: The job.
    """

    def __init__(self, message: str, *, job_id: int) -> None:
        super().__init__(message)
        self.job_id = job_id


class LeaseLost(JobError):
    """The worker's lease on the job expired and it is gone (another worker may hold it): the
    worker must stop and publish nothing; whoever holds the job now finishes it."""

    retryable: ClassVar[bool] = True


class JobInterrupted(JobError):
    """The job ran into its time limit, or the worker was asked to stop (SIGTERM)."""

    retryable: ClassVar[bool] = True


class ApiError(FleetError):
    """An HTTP request is refused.

    Args:
        detail: Human-readable text or a list of problems (rendered as ``detail``).
        headers: Extra response headers (``WWW-Authenticate``, ``Retry-After``).
    """

    status: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"

    def __init__(self, detail: Any = None, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail if isinstance(detail, str) else self.code)
        self.detail = detail
        self.headers = headers or {}


class BadRequest(ApiError):
    status = 400
    code = "bad_request"


class Unauthorized(ApiError):
    status = 401
    code = "unauthorized"

    def __init__(self, detail: Any = "missing or unknown bearer token") -> None:
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(ApiError):
    status = 403
    code = "forbidden"


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class PayloadTooLarge(ApiError):
    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(ApiError):
    status = 415
    code = "unsupported_media_type"


class Unprocessable(ApiError):
    status = 422
    code = "unprocessable"


class TooManyRequests(ApiError):
    """Too many failed logins for this user from this address; retry after ``Retry-After``."""

    status = 429
    code = "too_many_requests"

    def __init__(self, detail: Any, *, retry_after_s: int) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after_s)})
        self.retry_after_s = retry_after_s


class CorruptArchive(ApiError):
    """A stored model archive no longer matches its recorded sha256 (damaged in the database):
    it is not served; the operator pushes the package again (:mod:`fleet.registry.integrity`).
    """

    status = 500
    code = "corrupt_archive"
