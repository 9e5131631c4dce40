"""The dashboard's charts as inline SVG, drawn on the server (no script, no request).

Colours are CSS classes (static/dashboard.css) except the matrix tiles', which carry their
score as a fill colour. Every chart is an ``<svg class="chart" data-chart="name">``; what it
draws are ``polyline``/``rect`` elements (the browser test checks they are there and not empty).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from markupsafe import Markup

from service.db.dashboard import ExperienceMatrix

WIDTH, HEIGHT = 640, 220
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 56, 12, 12, 36


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    css_class: str
    step: bool = False  # a staircase (the value holds until the next point)


def _number(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _svg_open(name: str, title: str, width: int = WIDTH, height: int = HEIGHT) -> str:
    return (
        f'<svg class="chart" data-chart="{escape(name)}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>"
    )


def line_chart(
    name: str, title: str, series: Sequence[Series], x_label: str, y_label: str
) -> Markup:
    """Lines over a shared x axis (from 0), y from 0 to the largest value; with a legend."""
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    x_max = max(xs, default=1.0) or 1.0
    y_max = max(ys, default=1.0) or 1.0
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def at(x: float, y: float) -> str:
        return (
            f"{MARGIN_LEFT + plot_w * x / x_max:.1f},"
            f"{MARGIN_TOP + plot_h * (1 - y / y_max):.1f}"
        )

    parts = [_svg_open(name, title), _axes(x_max, y_max, x_label, y_label)]
    for number, s in enumerate(series):
        points = _staircase(s.points) if s.step else list(s.points)
        if len(points) == 1:  # one point still draws a visible mark
            points = [(0.0, points[0][1]), points[0]]
        coordinates = " ".join(at(x, y) for x, y in points)
        parts.append(f'<polyline class="line {escape(s.css_class)}" points="{coordinates}"/>')
        legend_y = MARGIN_TOP + 14 * number + 10
        parts.append(
            f'<rect class="swatch {escape(s.css_class)}" x="{MARGIN_LEFT + 8}" '
            f'y="{legend_y - 8}" width="10" height="10"/>'
            f'<text class="legend" x="{MARGIN_LEFT + 22}" y="{legend_y + 1}">'
            f"{escape(s.name)}</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def _staircase(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Each value held until the next point's x."""
    held = [p for a, b in zip(points, points[1:], strict=False) for p in (a, (b[0], a[1]))]
    return held + list(points[-1:])


def _axes(x_max: float, y_max: float, x_label: str, y_label: str) -> str:
    left, bottom = MARGIN_LEFT, HEIGHT - MARGIN_BOTTOM
    right = WIDTH - MARGIN_RIGHT
    return (
        f'<line class="axis" x1="{left}" y1="{MARGIN_TOP}" x2="{left}" y2="{bottom}"/>'
        f'<line class="axis" x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}"/>'
        f'<text class="tick" x="{left - 4}" y="{MARGIN_TOP + 8}" text-anchor="end">'
        f"{_number(y_max)}</text>"
        f'<text class="tick" x="{left - 4}" y="{bottom}" text-anchor="end">0</text>'
        f'<text class="tick" x="{right}" y="{bottom + 14}" text-anchor="end">'
        f"{_number(x_max)}</text>"
        f'<text class="tick" x="{left}" y="{bottom + 14}">0</text>'
        f'<text class="label" x="{(left + right) / 2}" y="{HEIGHT - 4}" text-anchor="middle">'
        f"{escape(x_label)}</text>"
        f'<text class="label" x="12" y="{(MARGIN_TOP + bottom) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 12 {(MARGIN_TOP + bottom) / 2})">{escape(y_label)}</text>'
    )


def share_bar(name: str, title: str, parts: Sequence[tuple[str, int, str]]) -> Markup:
    """One horizontal bar split by share: (label, count, css class) per part, with a legend."""
    total = sum(count for _, count, _ in parts) or 1
    width, bar_h = WIDTH - 24, 28
    out = [_svg_open(name, title, height=80)]
    x = 12.0
    for number, (label, count, css_class) in enumerate(parts):
        share = count / total
        out.append(
            f'<rect class="part {escape(css_class)}" x="{x:.1f}" y="8" '
            f'width="{width * share:.1f}" height="{bar_h}"><title>{escape(label)}: {count} '
            f"({share:.0%})</title></rect>"
        )
        x += width * share
        legend_x = 12 + 200 * number
        out.append(
            f'<rect class="swatch {escape(css_class)}" x="{legend_x}" y="52" width="10" '
            f'height="10"/><text class="legend" x="{legend_x + 14}" y="61">'
            f"{escape(label)} {count} ({share:.0%})</text>"
        )
    out.append("</svg>")
    return Markup("".join(out))


def score_colour(score: float) -> str:
    """A score in [0, 1] on a light-to-dark blue ramp."""
    t = min(1.0, max(0.0, score))
    low, high = (239, 243, 255), (8, 48, 107)
    r, g, b = (round(a + (c - a) * t) for a, c in zip(low, high, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


#: Matrix tiles are drawn in this many shades per kind (observed, estimated): one SVG path per
#: shade keeps a 100 × 200 matrix of tiles a few hundred kilobytes (a rect each was 1.7 MB).
MATRIX_SHADES = 10


def matrix_chart(matrix: ExperienceMatrix, cell: int = 4) -> Markup:
    """Queries (rows, oldest on top) × memory-id ranges (columns): a tile with observed cells
    is coloured by their mean score, one with only estimated candidates shaded (pale, its mean
    estimate's colour at low opacity); scores are rounded to :data:`MATRIX_SHADES` shades, each
    shade one path whose tooltip names its kind and score range."""
    rows = max(1, len(matrix.query_ids))
    width, height = matrix.columns * cell + 2, rows * cell + 2
    shades: dict[tuple[str, int], list[str]] = {}
    for tile in matrix.tiles:
        kind, mean = (
            ("observed", tile.observed_mean)
            if tile.observed_mean is not None
            else ("estimated", tile.estimated_mean)
        )
        if mean is None:
            continue
        shade = min(MATRIX_SHADES - 1, max(0, int(mean * MATRIX_SHADES)))
        x, y = 1 + tile.column * cell, 1 + tile.row * cell
        shades.setdefault((kind, shade), []).append(f"M{x} {y}h{cell}v{cell}h-{cell}z")
    out = [_svg_open("matrix", "Experience matrix", width, height)]
    out.append(f'<rect class="matrix-frame" x="0" y="0" width="{width}" height="{height}"/>')
    for (kind, shade), tiles in sorted(shades.items()):
        low, high = shade / MATRIX_SHADES, (shade + 1) / MATRIX_SHADES
        opacity = 1.0 if kind == "observed" else 0.3
        out.append(
            f'<path class="{kind}" fill="{score_colour((low + high) / 2)}" '
            f'fill-opacity="{opacity}" d="{"".join(tiles)}"><title>{kind}, mean score '
            f"{low:.1f}–{high:.1f}: {len(tiles)} tiles</title></path>"
        )
    out.append("</svg>")
    return Markup("".join(out))


def colour_scale() -> Markup:
    """The legend of the matrix colours: observed 0..1, then estimated 0..1 (shaded)."""
    out = [_svg_open("matrix-legend", "Score colours", 420, 44)]
    for step in range(11):
        score = step / 10
        out.append(
            f'<rect class="part" x="{12 + step * 16}" y="4" width="16" height="14" '
            f'fill="{score_colour(score)}"/>'
            f'<rect class="part" x="{230 + step * 16}" y="4" width="16" height="14" '
            f'fill="{score_colour(score)}" fill-opacity="0.3"/>'
        )
    out.append(
        '<text class="legend" x="12" y="34">observed 0 → 1</text>'
        '<text class="legend" x="230" y="34">estimated 0 → 1 (shaded)</text></svg>'
    )
    return Markup("".join(out))
