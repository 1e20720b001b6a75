# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark arithmetic and the PNG writer."""
from __future__ import annotations

import struct
import zlib

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _bench as b
from ansible_collections.dgxspark.vllm.plugins.module_utils import _png as p

SSE = [
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n', b"\n",
    b'data: {"choices":[{"index":0,"delta":{"content":"def"}}]}\n', b"\n",
    b'data: {"choices":[{"index":0,"delta":{"content":" is_prime"}}]}\n', b"\n",
    b'data: {"choices":[{"index":0,"delta":{"content":"(n):"}}]}\n', b"\n",
    b'data: {"choices":[],"usage":{"prompt_tokens":24,"completion_tokens":5,"total_tokens":29}}\n', b"\n",
    b"data: [DONE]\n", b'data: {"ignored": true}\n',
]


def test_parse_sse_stops_at_done():
    events = list(b.parse_sse(SSE))
    assert len(events) == 5 and events[-1]["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("line, match", [(b"data: {oops\n", "not JSON"), (b'data: {"error": {"message": "x"}}\n', "error")])
def test_parse_sse_errors(line, match):
    with pytest.raises(b.BenchError, match=match):
        list(b.parse_sse([line]))


def test_summarise_stream_uses_usage_and_text_times():
    events = list(b.parse_sse(SSE))
    times = [10.0, 10.5, 10.7, 11.5, 11.6]
    result = b.summarise_stream(10.0, list(zip(times, events)))
    assert result.ttft_s == 0.5                       # the empty role chunk does not count
    assert result.completion_tokens == 5 and result.prompt_tokens == 24
    assert result.decode_tok_s == round(4 / 1.0, 2)   # tokens after the first over first→last text
    assert result.total_s == 1.6


def test_summarise_stream_without_text_fails():
    with pytest.raises(b.BenchError):
        b.summarise_stream(0.0, [(1.0, {"choices": [{"delta": {"content": ""}}]})])


def test_sweep_row_and_csv():
    r = b.StreamResult(ttft_s=0.2, decode_tok_s=20.0, completion_tokens=100, prompt_tokens=24, total_s=5.0)
    row = b.sweep_row(2, [r, r], 5.0, 0)
    assert row["aggregate_tok_s"] == 40.0 and row["decode_tok_s"] == 20.0 and row["requests"] == 2
    text = b.to_csv([b.single_row("decode", r), row])
    assert text.splitlines()[0].startswith("test,concurrency,requests")
    assert text.splitlines()[1].startswith("decode,1,1,24,100,0.2,20.0,,5.0,0")
    assert b.chart_groups([row]) == [("2x", [40.0, 20.0])]


def test_sweep_row_all_failed():
    row = b.sweep_row(4, [], 1.0, 4)
    assert row["errors"] == 4 and row["aggregate_tok_s"] is None


def test_large_prompt_and_scaling():
    assert len(b.large_prompt(5000)) == 5000
    assert b.scale_chars(6000, 3000, 1000) == 2000
    with pytest.raises(b.BenchError):
        b.large_prompt(10)
    with pytest.raises(b.BenchError):
        b.scale_chars(100, 0, 10)


def _decode_png(data: bytes):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + length
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    return width, height, zlib.decompress(chunks[b"IDAT"])


def test_bar_chart_is_a_valid_png_with_bars():
    width, height, raw = _decode_png(p.bar_chart([("1x", [10.0, 10.0]), ("2x", [19.0, 9.5])], 200, 120))
    assert (width, height) == (200, 120) and len(raw) == height * (1 + width * 3)
    assert bytes(p.PALETTE[0]) in raw and bytes(p.PALETTE[1]) in raw


@pytest.mark.parametrize("groups", [[], [("a", [1.0]), ("b", [1.0, 2.0])], [("a", [-1.0])]])
def test_bar_chart_errors(groups):
    with pytest.raises(p.PngError):
        p.bar_chart(groups)


def test_encode_png_size_mismatch():
    with pytest.raises(p.PngError):
        p.encode_png(2, 2, bytearray(3))
