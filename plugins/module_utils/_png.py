# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A tiny PNG bar-chart writer (zlib + struct, no imaging library).

Private to the collection; may change at any time. Grayscale-free RGB, one bar group per label, the value
printed above each bar and the label below in a 3x5 pixel font (digits, '.', '-', '/', ' ', 'x').
"""
from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

_FONT = {  # 3x5, rows top to bottom, 3 bits each (MSB = left)
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 2, 2, 2),
    "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7), ".": (0, 0, 0, 0, 2), "-": (0, 0, 7, 0, 0),
    "/": (1, 1, 2, 4, 4), " ": (0, 0, 0, 0, 0), "x": (0, 5, 2, 5, 0),
}
PALETTE = ((52, 101, 164), (204, 102, 0), (78, 154, 6), (117, 80, 123))


class PngError(ValueError):
    """Input a chart cannot be drawn from."""


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(width: int, height: int, pixels: bytearray) -> bytes:
    """RGB pixels (row-major, 3 bytes each) → PNG bytes."""
    if width < 1 or height < 1 or len(pixels) != width * height * 3:
        raise PngError("pixel buffer does not match the size")
    raw = b"".join(b"\x00" + bytes(pixels[y * width * 3:(y + 1) * width * 3]) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")


class Canvas:
    def __init__(self, width: int, height: int, background: tuple[int, int, int] = (255, 255, 255)) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int]) -> None:
        for y in range(max(0, y0), min(self.height, y1)):
            start = (y * self.width + max(0, x0)) * 3
            count = max(0, min(self.width, x1) - max(0, x0))
            self.pixels[start:start + count * 3] = bytes(color) * count

    def text(self, x: int, y: int, text: str, color: tuple[int, int, int] = (0, 0, 0), scale: int = 2) -> None:
        for index, char in enumerate(text):
            glyph = _FONT.get(char, _FONT[" "])
            for row, bits in enumerate(glyph):
                for col in range(3):
                    if bits & (4 >> col):
                        px = x + (index * 4 + col) * scale
                        self.rect(px, y + row * scale, px + scale, y + (row + 1) * scale, color)

    def png(self) -> bytes:
        return encode_png(self.width, self.height, self.pixels)


def text_width(text: str, scale: int = 2) -> int:
    return max(0, len(text) * 4 - 1) * scale


def bar_chart(groups: Sequence[tuple[str, Sequence[float]]], width: int = 480, height: int = 240) -> bytes:
    """A grouped bar chart: [(label, [value per series])], same series count in every group, values >= 0."""
    if not groups:
        raise PngError("nothing to draw")
    series = len(groups[0][1])
    if series < 1 or any(len(values) != series for _label, values in groups):
        raise PngError("every group needs the same number of values (at least one)")
    values = [v for _label, vs in groups for v in vs]
    if any(v < 0 for v in values):
        raise PngError("bar values must be >= 0")
    top = max(values) or 1.0
    canvas = Canvas(width, height)
    left, right, bottom, top_margin = 10, 10, 20, 20
    plot_h = height - bottom - top_margin
    canvas.rect(left, height - bottom, width - right, height - bottom + 1, (0, 0, 0))
    slot = (width - left - right) / len(groups)
    bar_w = max(2, int(slot * 0.8 / series))
    for g, (label, vals) in enumerate(groups):
        x_start = int(left + g * slot + slot * 0.1)
        for s, value in enumerate(vals):
            h = int(round(plot_h * value / top))
            x0 = x_start + s * bar_w
            canvas.rect(x0, height - bottom - h, x0 + bar_w - 1, height - bottom, PALETTE[s % len(PALETTE)])
            shown = f"{value:.1f}" if value < 100 else f"{value:.0f}"
            canvas.text(x0 + max(0, (bar_w - text_width(shown)) // 2), height - bottom - h - 12, shown)
        canvas.text(int(left + g * slot + (slot - text_width(label)) / 2), height - bottom + 6, label)
    return canvas.png()
