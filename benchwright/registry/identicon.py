"""The benchmark identicon (§7): a 5x5 mirrored tile derived from the benchmark id alone, so the same id gives a
byte-identical SVG on every card and list."""

from __future__ import annotations

import hashlib

CELL = 10
SIZE = 5


def identicon_svg(benchmark_id: str) -> str:
    digest = hashlib.sha256(benchmark_id.encode()).digest()
    hue = int.from_bytes(digest[:2], "big") % 360
    color = f"hsl({hue},55%,50%)"
    rects = []
    for row in range(SIZE):
        for col in range(3):  # columns 0..2, mirrored onto 4..2
            if digest[2 + row * 3 + col] % 2:
                for x in {col, SIZE - 1 - col}:
                    rects.append(f'<rect x="{(x + 1) * CELL}" y="{(row + 1) * CELL}" width="{CELL}" height="{CELL}"/>')
    side = (SIZE + 2) * CELL
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{side}" height="{side}" viewBox="0 0 {side} {side}">'
            f'<rect width="{side}" height="{side}" fill="#f0f0f0"/>'
            f'<g fill="{color}">{"".join(sorted(rects))}</g></svg>')
