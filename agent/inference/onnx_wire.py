"""Just enough of the ONNX file format to find and expose a model's inner tensors, without the
``onnx`` package (whose import alone costs about 11 MB of resident memory).

An ONNX file is a protobuf ``ModelProto`` (https://github.com/onnx/onnx/blob/main/onnx/onnx.proto):
``graph`` is field 7 (``GraphProto``); in the graph, ``node`` is field 1 (``NodeProto``:
``input`` 1, ``output`` 2, ``op_type`` 4) and ``output`` field 12 (``ValueInfoProto``: ``name``
1). :func:`read_graph` reads the nodes and outputs (initializers are skipped, not copied);
:func:`with_outputs` adds graph outputs by appending a second ``graph`` field that holds only
them: protobuf parsers merge repeated occurrences of an embedded message, appending its
repeated fields (the encoding guide's "last one wins / merge" rule), so the result parses as
the model with the extra outputs, exactly as ``onnx.helper.make_empty_tensor_value_info``
appended to ``graph.output`` would.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from agent.errors import ModelError

_MODEL_GRAPH, _GRAPH_NODE, _GRAPH_OUTPUT = 7, 1, 12
_NODE_INPUT, _NODE_OUTPUT, _NODE_OP = 1, 2, 4
_VALUE_NAME = 1


@dataclass
class Node:
    """A graph node: its ``op_type`` and input / output tensor names."""

    op_type: str = ""
    input: list[str] = field(default_factory=list)
    output: list[str] = field(default_factory=list)


@dataclass
class Value:
    """A graph output: its tensor name."""

    name: str = ""


@dataclass
class Graph:
    """The nodes and outputs of a graph, in file order (the shape :func:`agent.inference.
    patch_map.map_outputs` walks)."""

    node: list[Node] = field(default_factory=list)
    output: list[Value] = field(default_factory=list)


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ModelError("truncated ONNX file (varint)")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: memoryview) -> Iterator[tuple[int, memoryview | int]]:
    """``(field number, bytes of a length-delimited field | value of a scalar)``."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ModelError("truncated ONNX file (field)")
            yield number, buf[pos:pos + size]
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ModelError(f"not an ONNX file (wire type {wire})")


def _text(value: memoryview | int) -> str:
    if isinstance(value, int):
        raise ModelError("not an ONNX file (a name is not a string)")
    return bytes(value).decode()


def read_graph(model: bytes) -> Graph:
    """The nodes and outputs of a serialised ``ModelProto``.

    Raises:
        ModelError: the bytes are not a protobuf message or hold no graph.
    """
    graph = Graph()
    found = False
    for number, value in _fields(memoryview(model)):
        if number != _MODEL_GRAPH or isinstance(value, int):
            continue
        found = True
        for g_number, g_value in _fields(value):
            if isinstance(g_value, int):
                continue
            if g_number == _GRAPH_NODE:
                node = Node()
                for n_number, n_value in _fields(g_value):
                    if n_number == _NODE_INPUT:
                        node.input.append(_text(n_value))
                    elif n_number == _NODE_OUTPUT:
                        node.output.append(_text(n_value))
                    elif n_number == _NODE_OP:
                        node.op_type = _text(n_value)
                graph.node.append(node)
            elif g_number == _GRAPH_OUTPUT:
                names = [_text(v) for n, v in _fields(g_value) if n == _VALUE_NAME]
                graph.output.append(Value(names[0] if names else ""))
    if not found or not graph.output:
        raise ModelError("not an ONNX model (no graph with outputs)")
    return graph


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def with_outputs(model: bytes, names: list[str]) -> bytes:
    """The serialised model with ``names`` appended to its graph's outputs (no type given:
    the runtime infers it).

    >>> read_graph(with_outputs(_field(7, _field(12, _field(1, b"score"))), ["d2"])).output
    [Value(name='score'), Value(name='d2')]
    """
    extra = b"".join(_field(_GRAPH_OUTPUT, _field(_VALUE_NAME, n.encode())) for n in names)
    return model + _field(_MODEL_GRAPH, extra)
