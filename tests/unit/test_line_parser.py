"""LineParser: framing and parsing of serial lines, without a port."""

from __future__ import annotations

import pytest

from agent.errors import RecordError
from agent.sources.serial import LineParser, ParsedLine

CH = ["a", "b", "c"]


def values(items: list[ParsedLine | RecordError]) -> list[list[float]]:
    return [i.values.tolist() for i in items if isinstance(i, ParsedLine)]


def reasons(items: list[ParsedLine | RecordError]) -> list[str]:
    return [i.reason for i in items if isinstance(i, RecordError)]


def feed_all(parser: LineParser, chunks: list[bytes]) -> list[ParsedLine | RecordError]:
    out: list[ParsedLine | RecordError] = []
    for chunk in chunks:
        out.extend(parser.feed(chunk))
    return out


def test_line_split_across_chunks_is_reassembled() -> None:
    p = LineParser(CH)
    out = feed_all(p, [b"1.", b"5,2", b",3\n4,5", b",6", b"\n"])
    assert values(out) == [[1.5, 2.0, 3.0], [4.0, 5.0, 6.0]]
    assert reasons(out) == []


def test_byte_at_a_time() -> None:
    p = LineParser(CH)
    data = b"1,2,3\r\n7,8,9\n"
    out = feed_all(p, [data[i : i + 1] for i in range(len(data))])
    assert values(out) == [[1.0, 2.0, 3.0], [7.0, 8.0, 9.0]]


def test_crlf_and_spaces() -> None:
    p = LineParser(CH)
    out = p.feed(b" 1 , 2 ,3 \r\n")
    assert values(out) == [[1.0, 2.0, 3.0]]


def test_empty_lines_are_skipped_silently() -> None:
    p = LineParser(CH)
    out = p.feed(b"\n\r\n   \n1,2,3\n\n")
    assert values(out) == [[1.0, 2.0, 3.0]]
    assert reasons(out) == []


def test_noise_bytes_and_non_utf8_are_rejected_then_recovered() -> None:
    p = LineParser(CH)
    out = p.feed(b"\xff\xfe\x00garbage\n1,2,3\n\x80,1,2\nx!#\n4,5,6\n")
    assert reasons(out) == ["not_utf8", "not_utf8", "field_count"]
    assert values(out) == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]


def test_order_of_accepts_and_rejects_is_kept() -> None:
    p = LineParser(CH)
    out = p.feed(b"1,2,3\n1,2\n4,5,6\n")
    kinds = ["ok" if isinstance(i, ParsedLine) else i.reason for i in out]
    assert kinds == ["ok", "field_count", "ok"]


@pytest.mark.parametrize("bad", [b"nan", b"inf", b"-inf", b"1e999", b"NaN", b"-Infinity"])
def test_non_finite_values(bad: bytes) -> None:
    p = LineParser(CH)
    out = p.feed(b"1," + bad + b",3\n")
    assert reasons(out) == ["non_finite"]


@pytest.mark.parametrize("bad", [b"x", b"", b"1.2.3", b"0x10"])
def test_non_numeric_values(bad: bytes) -> None:
    p = LineParser(CH)
    assert reasons(p.feed(b"1," + bad + b",3\n")) == ["non_numeric"]


def test_field_count() -> None:
    p = LineParser(CH)
    assert reasons(p.feed(b"1,2\n1,2,3,4\n")) == ["field_count", "field_count"]


def test_over_long_line_is_rejected_once_and_reader_resyncs() -> None:
    p = LineParser(CH, max_line_bytes=16)
    out = p.feed(b"1,2,3\n" + b"9" * 40)
    assert reasons(out) == ["too_long"]
    # The rest of the long line arrives in more chunks: no new reject, nothing buffered.
    out = feed_all(p, [b"9" * 100, b"9" * 100])
    assert out == []
    assert len(p._buffer) == 0  # bounded: the tail is dropped, not kept
    out = p.feed(b"999\n4,5,6\n")
    assert values(out) == [[4.0, 5.0, 6.0]]
    assert reasons(out) == []


def test_over_long_complete_line_in_one_chunk() -> None:
    p = LineParser(CH, max_line_bytes=16)
    out = p.feed(b"1" * 17 + b"\n1,2,3\n")
    assert reasons(out) == ["too_long"]
    assert values(out) == [[1.0, 2.0, 3.0]]


def test_line_of_exactly_max_bytes_with_crlf_split_is_accepted() -> None:
    line = b"1.00000,2.00,3.0"
    assert len(line) == 16
    p = LineParser(CH, max_line_bytes=16)
    assert p.feed(line + b"\r") == []
    assert values(p.feed(b"\n")) == [[1.0, 2.0, 3.0]]


def test_timestamp_field_csv() -> None:
    p = LineParser(CH, timestamp_field=True)
    out = p.feed(b"1583748873.25,1,2,3\nxx,1,2,3\nnan,1,2,3\n1,2,3\n")
    ok = [i for i in out if isinstance(i, ParsedLine)]
    assert [i.ts for i in ok] == [1583748873.25]
    assert reasons(out) == ["bad_timestamp", "bad_timestamp", "field_count"]


def test_no_timestamp_field_gives_none() -> None:
    out = LineParser(CH).feed(b"1,2,3\n")
    assert isinstance(out[0], ParsedLine) and out[0].ts is None


def test_semicolon_delimiter() -> None:
    assert values(LineParser(CH, delimiter=";").feed(b"1;2;3\n")) == [[1.0, 2.0, 3.0]]


def test_kv_order_free_extra_keys_ignored() -> None:
    p = LineParser(CH, fmt="kv")
    out = p.feed(b"c=3 a=1, b=2 rssi=-70\n")
    assert values(out) == [[1.0, 2.0, 3.0]]


def test_kv_missing_channel() -> None:
    p = LineParser(CH, fmt="kv")
    out = p.feed(b"a=1 b=2\n")
    assert reasons(out) == ["missing_channel"]
    assert "c" in str(out[0])


def test_kv_bad_values_and_tokens() -> None:
    p = LineParser(CH, fmt="kv")
    out = p.feed(b"a=1 b=x c=3\na=1 b=inf c=3\na=1 b c=3\n")
    assert reasons(out) == ["non_numeric", "non_finite", "non_numeric"]


def test_kv_timestamp_key() -> None:
    p = LineParser(CH, fmt="kv", timestamp_field=True)
    out = p.feed(b"ts=12.5 a=1 b=2 c=3\na=1 b=2 c=3\n")
    ok = [i for i in out if isinstance(i, ParsedLine)]
    assert [i.ts for i in ok] == [12.5]
    assert reasons(out) == ["bad_timestamp"]


def test_reset_drops_partial_line() -> None:
    p = LineParser(CH)
    p.feed(b"1,2")
    p.reset()
    assert values(p.feed(b"7,8,9\n")) == [[7.0, 8.0, 9.0]]


def test_values_are_float64_shape_c() -> None:
    out = LineParser(CH).feed(b"1,2,3\n")
    assert isinstance(out[0], ParsedLine)
    assert out[0].values.dtype.name == "float64"
    assert out[0].values.shape == (3,)
