"""Config of the ``opcua`` source: endpoint, security, subscription and the monitored nodes.

TOML shape::

    [streams.source]
    kind = "opcua"
    endpoint = "opc.tcp://192.168.10.30:4840"
    publishing_interval_ms = 100      # how often the server sends the changes it collected
    sampling_interval_ms = 100        # how often the server samples each node
    security_policy = "Basic256Sha256"          # or "None"
    security_mode = "SignAndEncrypt"            # or "Sign"
    certificate_file = "/etc/edge-agent/opcua-cert.der"
    private_key_file = "/etc/edge-agent/opcua-key.pem"
    server_certificate_file = "/etc/edge-agent/plc-cert.der"   # optional
    username = "edge"                           # optional; password from a file
    password_file = "/etc/edge-agent/opcua-password"
    [[streams.source.nodes]]          # one per channel, in the stream's channel order
    channel = "Pressure"
    node_id = "ns=2;s=Pump1.Pressure"           # or browse_path = "0:Objects/2:Pump1/2:Pressure"
    min = 0.0                                   # optional valid range
    max = 16.0

Node ids and browse paths use the OPC UA text forms (OPC 10000-6 §5.3.1.10 NodeId strings,
OPC 10000-4 §7.26 RelativePath as ``<ns>:<name>`` steps from the Objects folder root). A
security policy other than ``None`` needs the client certificate and key; every problem is
reported at its key path (``streams[0].source.nodes[1].node_id``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agent.config.base import StrictModel
from agent.sources.base import SourcePlugin

KIND = "opcua"


class NodeMap(StrictModel):
    """One monitored node and the channel its value feeds."""

    channel: str = Field(min_length=1, max_length=128, description="Channel name.")
    node_id: str | None = Field(
        None, min_length=3, max_length=512, examples=["ns=2;s=Pump1.Pressure", "i=2258"],
        description="NodeId in its text form (ns=<index>;i|s|g|b=<id>).",
    )
    browse_path: str | None = Field(
        None, min_length=3, max_length=1024, examples=["0:Objects/2:Pump1/2:Pressure"],
        description="Browse path from the root: '/'-separated <namespace index>:<browse name> "
        "steps; resolved once per connection.",
    )
    min: float | None = Field(None, description="Lowest valid value; below it is rejected.")
    max: float | None = Field(None, description="Highest valid value; above it is rejected.")

    @model_validator(mode="after")
    def _one_address(self) -> NodeMap:
        if (self.node_id is None) == (self.browse_path is None):
            raise ValueError("give exactly one of node_id and browse_path")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} > max {self.max}")
        return self


class OpcuaConfig(StrictModel):
    """OPC UA subscription source (asyncua client)."""

    kind: Literal["opcua"] = Field("opcua", description="Source kind.")
    endpoint: str = Field(
        pattern=r"^opc\.tcp://[^\s/]+(/\S*)?$", max_length=512,
        examples=["opc.tcp://192.168.10.30:4840"], description="Server endpoint URL.",
    )
    nodes: list[NodeMap] = Field(min_length=1, max_length=4096,
                                 description="Monitored nodes, one per channel.")
    publishing_interval_ms: float = Field(
        100.0, ge=10.0, le=3_600_000.0,
        description="Requested publishing interval of the subscription, ms.",
    )
    sampling_interval_ms: float = Field(
        100.0, ge=0.0, le=3_600_000.0,
        description="Requested sampling interval of each monitored item, ms (0 = as fast "
        "as the server can).",
    )
    queue_size: int = Field(10, ge=1, le=10_000,
                            description="Values the server queues per node between publishes.")
    timestamp: Literal["source", "server", "receive"] = Field(
        "source", description="Reading time: the server's SourceTimestamp of the newest "
        "change (fallback ServerTimestamp, then the receive time), the ServerTimestamp, or "
        "when the agent received it.",
    )
    security_policy: Literal["None", "Basic256Sha256"] = Field(
        "None", description="Security policy of the secure channel.")
    security_mode: Literal["Sign", "SignAndEncrypt"] = Field(
        "SignAndEncrypt", description="Message security mode when the policy is not None.")
    certificate_file: str | None = Field(
        None, description="Client application certificate (DER or PEM).")
    private_key_file: str | None = Field(None, description="Client private key (PEM).")
    server_certificate_file: str | None = Field(
        None, description="The server's certificate (DER or PEM); unset = the one the "
        "endpoint presents.")
    username: str | None = Field(None, min_length=1, max_length=256,
                                 description="User name; its password is read from password_file.")
    password_file: str | None = Field(None, description="File holding the user's password.")
    timeout_s: float = Field(4.0, gt=0, le=120.0,
                             description="Answer timeout of every request, seconds.")
    watchdog_s: float = Field(1.0, gt=0, le=60.0,
                              description="How often the connection is probed, seconds.")
    reconnect_initial_s: float = Field(1.0, gt=0, le=3600.0,
                                       description="First reconnect delay, seconds.")
    reconnect_max_s: float = Field(30.0, gt=0, le=3600.0,
                                   description="Longest reconnect delay, seconds.")

    def channel_names(self) -> list[str]:
        """The channel names of the monitored nodes, in order."""
        return [n.channel for n in self.nodes]

    @model_validator(mode="after")
    def _consistent(self) -> OpcuaConfig:
        names = [n.channel for n in self.nodes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"channels named twice: {dupes}")
        if self.security_policy != "None" and (self.certificate_file is None
                                               or self.private_key_file is None):
            raise ValueError(f"security_policy {self.security_policy!r} needs certificate_file "
                             "and private_key_file")
        if (self.username is None) != (self.password_file is None):
            raise ValueError("username and password_file go together")
        return self


PLUGIN = SourcePlugin(
    KIND, OpcuaConfig, "agent.sources.opcua:OpcuaSource",
    path_fields=("certificate_file", "private_key_file", "server_certificate_file",
                 "password_file"),
)
