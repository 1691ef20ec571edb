"""The modbus register map: impossible maps are config problems at their key path; reads are
coalesced within the protocol limits; values decode by type, word and byte order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.cli import EX_CONFIG, main
from agent.config.loader import parse_config
from agent.errors import ConfigError, RecordError
from agent.sources.modbus_config import ChannelMap, ModbusConfig
from agent.sources.modbus_map import decode, encode_float32, plan_reads

HEAD = """
[[streams]]
name = "plc"
[streams.source]
kind = "modbus"
host = "127.0.0.1"
"""


def channel(**fields: Any) -> str:
    body = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in fields.items())
    return f"[[streams.source.channels]]\n{body}\n"


def problems(*channels: str, head: str = HEAD) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(head + "".join(channels), env={})
    return info.value.problems


def test_a_good_map_validates() -> None:
    config = parse_config(HEAD + channel(name="a", address=0, type="float32")
                          + channel(name="b", address=2, type="bits", bit=3, bits=2)
                          + channel(name="c", address=2, type="bool", bit=0), env={})
    assert config.streams[0].source.kind == "modbus"


def test_overlapping_registers_with_different_types() -> None:
    assert problems(channel(name="a", address=0, type="float32"),
                    channel(name="b", address=1, type="uint16")) == [
        "streams[0].source.channels[1].address: 'b' (uint16 at 1) overlaps 'a' (float32 at 0) "
        "in unit 1 holding with a different type or order"]


def test_same_register_same_layout_in_another_unit_or_table_is_fine() -> None:
    parse_config(HEAD + channel(name="a", address=0, type="float32")
                 + channel(name="b", address=0, type="float32", scale=2.0)
                 + channel(name="c", address=1, type="uint16", unit=2)
                 + channel(name="d", address=1, type="uint16", table="input"), env={})


def test_float_at_an_odd_offset_needs_a_word_order() -> None:
    (problem,) = problems(channel(name="a", address=3, type="float32"))
    assert problem.startswith("streams[0].source.channels[0].word_order: float32 at odd "
                              "address 3 with no word_order")
    parse_config(HEAD + channel(name="a", address=3, type="float32", word_order="little"),
                 env={})


def test_other_impossible_entries_each_at_their_key() -> None:
    found = problems(
        channel(name="a", address=65534, type="float64", word_order="big"),
        channel(name="a", address=10, type="bits", bit=12, bits=8),
        channel(name="c", table="coil", address=1, type="uint16"),
        channel(name="d", address=20, scale=0.0),
        channel(name="e", address=21, min=5.0, max=1.0),
    )
    keys = sorted(p.split(": ", 1)[0] for p in found)
    assert keys == [
        "streams[0].source.channels[0].address",
        "streams[0].source.channels[1].bits",
        "streams[0].source.channels[1].name",
        "streams[0].source.channels[2].type",
        "streams[0].source.channels[3].scale",
        "streams[0].source.channels[4].min",
    ]
    (bad_type,) = problems(channel(name="f", address=22, type="int64"))
    assert bad_type.startswith("streams[0].source.channels[0].type: Input should be 'int16'")


def test_rtu_needs_a_serial_port() -> None:
    assert problems(channel(name="a", address=0), head=HEAD + 'transport = "rtu"\n') == [
        "streams[0].source.serial_port: transport 'rtu' needs a serial_port"]


def test_check_config_exits_78_with_the_key_path(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(HEAD + channel(name="a", address=1, type="int32"))
    assert main(["check-config", str(path)]) == EX_CONFIG
    assert "streams[0].source.channels[0].word_order: int32 at odd address 1" in (
        capsys.readouterr().err)


def test_check_config_names_model_channels_missing_from_the_map(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(HEAD + channel(name="Pressure", address=0, type="float32"))
    assert main(["check-config", str(path)]) == EX_CONFIG
    err = capsys.readouterr().err
    assert "streams[0].source.channels: the model's channel(s) ['Accelerometer1RMS'," in err
    assert "are not in the source's map (it has ['Pressure'])" in err


def _map(*channels: dict[str, Any]) -> list[ChannelMap]:
    return [ChannelMap.model_validate(c, strict=False) for c in channels]


def test_reads_are_split_at_the_protocol_limits_and_the_gap() -> None:
    regs = _map(*({"name": f"r{i}", "address": i} for i in range(300)))
    assert [(b.address, b.count) for b in plan_reads(regs, 8, 125, 2000)] == [
        (0, 125), (125, 125), (250, 50)]
    coils = _map(*({"name": f"c{i}", "address": i, "table": "coil", "type": "bool"}
                   for i in range(2500)))
    assert [(b.address, b.count) for b in plan_reads(coils, 8, 125, 2000)] == [
        (0, 2000), (2000, 500)]
    gaps = _map({"name": "a", "address": 0}, {"name": "b", "address": 9},
                {"name": "c", "address": 19})
    assert [(b.address, b.count) for b in plan_reads(gaps, 8, 125, 2000)] == [(0, 10), (19, 1)]
    assert [(b.address, b.count) for b in plan_reads(gaps, 9, 125, 2000)] == [(0, 20)]
    assert len(plan_reads(gaps, 0, 125, 2000)) == 3
    # a float32 never straddles two requests
    wide = _map({"name": "a", "address": 0}, {"name": "f", "address": 124, "type": "float32"})
    assert [(b.address, b.count) for b in plan_reads(wide, 200, 125, 2000)] == [(0, 1),
                                                                                 (124, 2)]


def test_decoding_types_orders_scale_and_range() -> None:
    f64 = _map({"name": "d", "address": 0, "type": "float64"})[0]
    import struct  # noqa: PLC0415

    words = [int.from_bytes(struct.pack(">d", -1.25)[i:i + 2], "big") for i in (0, 2, 4, 6)]
    assert decode(f64, words, 0) == -1.25
    swapped = _map({"name": "s", "address": 4, "type": "uint32", "byte_order": "little",
                    "word_order": "little"})[0]
    assert decode(swapped, [0, 0, 0, 0, 0x7856, 0x3412], 0) == 0x12345678
    scaled = _map({"name": "t", "address": 0, "type": "int16", "scale": 0.5, "offset": 10,
                   "min": 0, "max": 20})[0]
    assert decode(scaled, [(-4) & 0xFFFF], 0) == 8.0
    with pytest.raises(RecordError) as info:
        decode(scaled, [30], 0)
    assert info.value.reason == "out_of_range"
    nan = _map({"name": "n", "address": 0, "type": "float32"})[0]
    with pytest.raises(RecordError) as info:
        decode(nan, encode_float32(float("inf")), 0)
    assert info.value.reason == "non_finite"


def test_a_coil_without_a_type_is_a_bool() -> None:
    config = parse_config(HEAD + channel(name="door", table="coil", address=3), env={})
    source = config.streams[0].source
    assert isinstance(source, ModbusConfig) and source.channels[0].type == "bool"


def test_config_defaults_are_the_protocol_limits() -> None:
    cfg = ModbusConfig.model_validate({"channels": [{"name": "a", "address": 0}]}, strict=False)
    assert (cfg.max_registers_per_read, cfg.max_bits_per_read) == (125, 2000)
    assert cfg.parity == "E"


def test_without_pymodbus_the_stream_is_a_config_problem_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys  # noqa: PLC0415

    from agent.sources.registry import build_source  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "pymodbus.exceptions", None)  # import fails
    cfg = ModbusConfig.model_validate({"channels": [{"name": "a", "address": 0}]}, strict=False)
    with pytest.raises(ConfigError, match=r"needs pymodbus: pip install "
                                          r"'edge-anomaly-agent\[modbus\]'"):
        build_source(cfg, "plc")
