"""Small inline SVG charts for the console's health page: one or more series over the last hour.

Pure: numbers in, :class:`Markup` out (no script, no external asset). Labels
are escaped like everything else.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.api.console.markup import Markup, join, render

WIDTH, HEIGHT, PAD = 560, 140, 28
COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea")


def line_chart(
    title: str, labels: Sequence[str], series: Sequence[tuple[str, Sequence[float | None]]], unit: str = ""
) -> Markup:
    """A line chart of ``series`` (name, values per label); None values leave a gap."""
    values = [v for _, points in series for v in points if v is not None]
    top = max(values) if values else 0.0
    top = top if top > 0 else 1.0
    count = max(len(labels), 2)

    def x(i: int) -> float:
        return PAD + (WIDTH - 2 * PAD) * i / (count - 1)

    def y(v: float) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * v / top

    lines = []
    legend = []
    for n, (name, points) in enumerate(series):
        color = COLORS[n % len(COLORS)]
        segments: list[list[str]] = [[]]
        for i, value in enumerate(points):
            if value is None:
                segments.append([])
            else:
                segments[-1].append(f"{x(i):.1f},{y(value):.1f}")
        for segment in segments:
            if len(segment) == 1:
                cx, cy = segment[0].split(",")
                lines.append(render('<circle cx="{cx}" cy="{cy}" r="2" fill="{c}"/>', cx=cx, cy=cy, c=color))
            elif segment:
                lines.append(
                    render(
                        '<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{p}"/>',
                        c=color,
                        p=" ".join(segment),
                    )
                )
        legend.append(render('<tspan fill="{c}">■ {name}</tspan> ', c=color, name=name))
    first = labels[0] if labels else ""
    last = labels[-1] if labels else ""
    return render(
        '<figure class="chart"><svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{title}">'
        '<text x="{pad}" y="14" class="chart-title">{title}</text>'
        '<text x="{right}" y="14" text-anchor="end" class="chart-legend">{legend}</text>'
        '<line x1="{pad}" y1="{base}" x2="{right}" y2="{base}" stroke="#999"/>'
        '<text x="4" y="{topy}" class="chart-axis">{top}{unit}</text>'
        '<text x="4" y="{base}" class="chart-axis">0</text>'
        '<text x="{pad}" y="{labely}" class="chart-axis">{first}</text>'
        '<text x="{right}" y="{labely}" text-anchor="end" class="chart-axis">{last}</text>'
        "{lines}</svg></figure>",
        w=WIDTH,
        h=HEIGHT,
        pad=PAD,
        right=WIDTH - PAD,
        base=HEIGHT - PAD,
        topy=PAD + 4,
        labely=HEIGHT - 8,
        title=title,
        legend=join(legend),
        top=_number(top),
        unit=unit,
        first=first,
        last=last,
        lines=join(lines),
    )


def _number(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"
