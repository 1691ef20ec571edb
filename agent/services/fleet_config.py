"""The ``[fleet]`` config of the uploader and the device token it names.

:class:`FleetConfig` is part of the agent's config schema (:mod:`agent.config.schema`);
:func:`read_token` reads the token from its file (checked like every secret file,
:mod:`agent.secret_files`) or its environment variable. The upload loop:
:mod:`agent.services.uploader`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, model_validator

from agent.config.base import StrictModel
from agent.errors import ConfigError
from agent.secret_files import check_secret_file
from agent.services.fleet_transport import check_tls_fields
from cloud_sync.protocol import MAX_BATCH_RECORDS

#: Default (and config default) of batches in flight at once (:mod:`agent.services.uploader`).
DEFAULT_MAX_IN_FLIGHT = 2
#: Largest ``max_in_flight`` accepted.
MAX_IN_FLIGHT = 8


class FleetConfig(StrictModel):
    """Config of the fleet uploader (``[fleet]``)."""

    enabled: bool = Field(False, description="Upload alerts and aggregates to the fleet service.")
    url: str | None = Field(
        None,
        examples=["https://fleet.example.com:8443"],
        description="Fleet base URL (http or https); required when enabled.",
    )
    token_file: str | None = Field(
        None,
        examples=["/etc/edge-agent/fleet.token"],
        description="File holding the device token (first line); the token is never inline. "
        "Exactly one of token_file and token_env when enabled.",
    )
    token_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        examples=["EDGE_FLEET_TOKEN"],
        description="Name of the environment variable holding the device token.",
    )
    ca_file: str | None = Field(
        None,
        examples=["/etc/edge-agent/fleet-ca.pem"],
        description="PEM bundle of the CA(s) that sign the fleet's https certificate; unset = "
        "the system's trust store. Needs an https url.",
    )
    pinned_pubkey: str | None = Field(
        None,
        examples=["sha256//YhKJKSzoTt2b5FP18fvpHo7fJYqQCjAa3HWY3tvRMwE="],
        description="Pinned server key(s), as curl's --pinnedpubkey: 'sha256//<base64 of the "
        "SHA-256 of the certificate's SubjectPublicKeyInfo>', several separated by ';'; unset "
        "= no pinning. Checked on top of the chain (docs/security.md). Needs an https url.",
    )
    batch_records: int = Field(
        500, ge=1, le=MAX_BATCH_RECORDS,
        description=f"Records per upload request (1..{MAX_BATCH_RECORDS}).",
    )
    max_in_flight: int = Field(
        DEFAULT_MAX_IN_FLIGHT, ge=1, le=MAX_IN_FLIGHT,
        description="Upload requests in flight at once while draining a backlog (1..8; one "
        "HTTP connection each). 2 overlaps the agent's and the fleet's work; 1 sends one batch "
        "at a time. Rows are cleared only when acknowledged either way.",
    )
    interval_s: float = Field(
        5.0, gt=0.0, description="Seconds between uploads while idle (new alerts wake it early)."
    )
    gzip_level: int = Field(
        6, ge=1, le=9,
        description="gzip level of upload bodies: 1 is fastest (a few ms per 5,000 records), "
        "9 smallest.",
    )
    connect_timeout_s: float = Field(5.0, gt=0.0, description="TCP/TLS connect timeout, seconds.")
    read_timeout_s: float = Field(
        30.0, gt=0.0, description="Seconds to wait for each read of the fleet's response. A "
        "whole request is cut off after connect_timeout_s + 2 x read_timeout_s, plus its "
        "body or download size at 64 KiB/s, however the fleet trickles its answer.",
    )
    max_bytes_per_s: int | None = Field(
        None, ge=1024, examples=[65536],
        description="Upload bandwidth cap on compressed bytes per second; unset = unlimited.",
    )
    backoff_max_s: float = Field(
        300.0, gt=0.0, description="Longest wait between retries while the fleet is unreachable."
    )
    health_interval_s: float = Field(
        60.0, ge=0.0, description="Seconds between two health reports to the fleet "
        "(POST /v1/devices/self/health: the /healthz report in short); 0 sends none.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> FleetConfig:
        if self.enabled:
            if self.url is None:
                raise ValueError("url is required when the fleet uploader is enabled")
            if (self.token_file is None) == (self.token_env is None):
                raise ValueError("set exactly one of token_file and token_env when enabled")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")
        check_tls_fields(self.url, self.ca_file, self.pinned_pubkey)
        return self


def read_token(config: FleetConfig, env: Mapping[str, str] | None = None) -> str:
    """Return the device token named by ``config`` (file's first line, or the env variable).

    Raises:
        ConfigError: The file is unreadable, empty or writable by others
            (:func:`agent.secret_files.check_secret_file`), or the variable is unset or empty.
    """
    environ = os.environ if env is None else env
    if config.token_env is not None:
        token = environ.get(config.token_env, "").strip()
        where = f"fleet.token_env: environment variable {config.token_env}"
    elif config.token_file is not None:
        where = f"fleet.token_file: {config.token_file!r}"
        check_secret_file(config.token_file, "fleet.token_file")
        try:
            lines = Path(config.token_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"{where}: cannot read: {exc}"
            raise ConfigError(msg, problems=[msg]) from exc
        token = lines[0].strip() if lines else ""
    else:
        msg = "fleet: no token_file or token_env"
        raise ConfigError(msg, problems=[msg])
    if not token:
        msg = f"{where} is empty or unset"
        raise ConfigError(msg, problems=[msg])
    return token
