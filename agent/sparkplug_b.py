"""Sparkplug B wire format: the protobuf payload schema, datatypes and the topic namespace.

Shared by the Sparkplug B *input* (:mod:`agent.sources.sparkplug`, MQTT-in streams) and the
Sparkplug B *output* (:mod:`agent.publish.sparkplug_edge`, the agent as an edge node).

Message schema: the ``org.eclipse.tahu.protobuf.Payload`` message of the Sparkplug B
specification (Eclipse Sparkplug 3.0.0, §6.4 and its ``sparkplug_b.proto``), built here at import
time with protobuf's descriptor API (no generated code, no protoc). It declares the fields a
scalar metric uses (numbers, booleans, strings, bytes), with the specification's field numbers;
the rest (metadata, property sets, data sets, templates) are unknown fields that the protobuf
parser skips.

Topics (§4.1): ``spBv1.0/<group_id>/<NBIRTH|NDATA|NDEATH|NCMD>/<edge_node_id>`` and
``spBv1.0/<group_id>/<DBIRTH|DDATA|DDEATH|DCMD>/<edge_node_id>/<device_id>``; a rebirth is
requested with an NCMD carrying the boolean metric ``Node Control/Rebirth`` (§6.4.17).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

#: Sparkplug B datatypes (§6.4.16) whose value is a number or a boolean.
NUMERIC_TYPES = {1: "Int8", 2: "Int16", 3: "Int32", 4: "Int64", 5: "UInt8", 6: "UInt16",
                 7: "UInt32", 8: "UInt64", 9: "Float", 10: "Double", 11: "Boolean"}
REBIRTH_METRIC = "Node Control/Rebirth"
BDSEQ_METRIC = "bdSeq"
NAMESPACE = "spBv1.0"

#: Sparkplug B datatype codes (§6.4.16) the agent publishes.
INT64 = 4
UINT64 = 8
DOUBLE = 10
BOOLEAN = 11
STRING = 12

_F = descriptor_pb2.FieldDescriptorProto


def _schema() -> tuple[Any, Any]:
    fd = descriptor_pb2.FileDescriptorProto(name="edge_agent_sparkplug_b.proto",
                                            package="org.eclipse.tahu.protobuf", syntax="proto2")
    payload = fd.message_type.add(name="Payload")
    metric = payload.nested_type.add(name="Metric")
    metric.oneof_decl.add(name="value")
    opt = _F.LABEL_OPTIONAL
    for name, number, kind in [("name", 1, _F.TYPE_STRING), ("alias", 2, _F.TYPE_UINT64),
                               ("timestamp", 3, _F.TYPE_UINT64), ("datatype", 4, _F.TYPE_UINT32),
                               ("is_historical", 5, _F.TYPE_BOOL),
                               ("is_transient", 6, _F.TYPE_BOOL), ("is_null", 7, _F.TYPE_BOOL)]:
        metric.field.add(name=name, number=number, type=kind, label=opt)
    for name, number, kind in [("int_value", 10, _F.TYPE_UINT32),
                               ("long_value", 11, _F.TYPE_UINT64),
                               ("float_value", 12, _F.TYPE_FLOAT),
                               ("double_value", 13, _F.TYPE_DOUBLE),
                               ("boolean_value", 14, _F.TYPE_BOOL),
                               ("string_value", 15, _F.TYPE_STRING),
                               ("bytes_value", 16, _F.TYPE_BYTES)]:
        metric.field.add(name=name, number=number, type=kind, label=opt, oneof_index=0)
    payload.field.add(name="timestamp", number=1, type=_F.TYPE_UINT64, label=opt)
    payload.field.add(name="metrics", number=2, type=_F.TYPE_MESSAGE,
                      label=_F.LABEL_REPEATED,
                      type_name=".org.eclipse.tahu.protobuf.Payload.Metric")
    payload.field.add(name="seq", number=3, type=_F.TYPE_UINT64, label=opt)
    payload.field.add(name="uuid", number=4, type=_F.TYPE_STRING, label=opt)
    payload.field.add(name="body", number=5, type=_F.TYPE_BYTES, label=opt)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    desc = pool.FindMessageTypeByName("org.eclipse.tahu.protobuf.Payload")
    return message_factory.GetMessageClass(desc), desc


#: The protobuf message class of a Sparkplug B payload (``Payload()``, ``.metrics.add()`` ...).
Payload, _DESCRIPTOR = _schema()


class SparkplugError(ValueError):
    """A payload or topic that is not valid Sparkplug B (``reason`` is the reject reason)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Topic:
    """A parsed Sparkplug B topic."""

    group: str
    kind: str
    node: str
    device: str | None


def parse_topic(topic: str) -> Topic:
    """Parse ``spBv1.0/group/KIND/node[/device]``.

    Raises:
        SparkplugError: not a Sparkplug B topic (reason ``bad_topic``).
    """
    parts = topic.split("/")
    if len(parts) not in (4, 5) or parts[0] != NAMESPACE:
        raise SparkplugError(f"not a Sparkplug B topic: {topic[:200]!r}", "bad_topic")
    return Topic(parts[1], parts[2], parts[3], parts[4] if len(parts) == 5 else None)


def decode(data: bytes) -> Any:
    """Parse a Payload.

    Raises:
        SparkplugError: not a protobuf Sparkplug B payload (reason ``bad_payload``).
    """
    msg = Payload()
    try:
        msg.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise SparkplugError(f"not a Sparkplug B payload ({len(data)} bytes): {exc}",
                             "bad_payload") from exc
    return msg


def metric_value(metric: Any) -> float | None:
    """The metric's value as a float; None for a null or non-numeric metric."""
    if metric.is_null:
        return None
    which = metric.WhichOneof("value")
    if which in ("int_value", "long_value"):
        raw = int(getattr(metric, which))
        bits = 32 if which == "int_value" else 64
        # Int8/16/32 travel as the uint32 of their two's complement, Int64 as the uint64 one
        if int(metric.datatype) in (1, 2, 3, 4) and raw >= 1 << (bits - 1):
            raw -= 1 << bits
        return float(raw)
    if which in ("float_value", "double_value"):
        return float(getattr(metric, which))
    if which == "boolean_value":
        return 1.0 if metric.boolean_value else 0.0
    return None


def rebirth_payload(timestamp_ms: int) -> bytes:
    """An NCMD payload asking the node for a rebirth (§6.4.17)."""
    msg = Payload(timestamp=timestamp_ms)
    m = msg.metrics.add(name=REBIRTH_METRIC, datatype=11, timestamp=timestamp_ms)
    m.boolean_value = True
    return bytes(msg.SerializeToString())
