"""A line chart as SVG, drawn on the server.

Why no chart library: the console ships in the wheel and runs on machines without internet, and
its pages run no script at all (their Content-Security-Policy forbids it). A few polylines and
labels are all a lag over time needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from outbox.app.history import Point
from outbox.core.durations import format_duration

#: Distinct colours for up to eight rescuers; more reuse them.
PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f")


@dataclass(frozen=True)
class Line:
    name: str
    colour: str
    points: str  # "x,y x,y ..." for <polyline points>


@dataclass(frozen=True)
class Tick:
    at: float  # pixels along the axis
    label: str
    anchor: str = "end"  # SVG text-anchor: the x axis's ends stay inside the chart


@dataclass
class Chart:
    width: int
    height: int
    left: int
    bottom: int
    lines: list[Line] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)


#: Steps a time axis reads well in: seconds up to a day, then whole days.
STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def _step(value: float) -> float:
    """The smallest readable step at least ``value`` (seconds)."""
    for step in STEPS:
        if step >= value:
            return float(step)
    return 86400.0 * -(-value // 86400)


def line_chart(
    series: dict[str, list[Point]],
    *,
    start: datetime,
    end: datetime,
    width: int = 760,
    height: int = 240,
    label: Callable[[float], str] | None = None,
) -> Chart:
    """Each series a line over ``start``..``end``; the y axis starts at 0 (a lag of 0 is the
    goal, so the chart shows how far from it, not the noise)."""
    left, bottom, top, right = 64, 28, 10, 10
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max((p.value for pts in series.values() for p in pts), default=0.0)
    y_max = 4 * _step(peak / 4)  # four readable steps: 0, 15s, 30s, 45s, 1m
    span = max(1.0, (end - start).total_seconds())

    def x(at: datetime) -> float:
        return left + plot_w * min(1.0, max(0.0, (at - start).total_seconds() / span))

    def y(v: float) -> float:
        return top + plot_h * (1 - min(1.0, max(0.0, v / y_max)))

    chart = Chart(width, height, left, height - bottom)
    for i, (name, points) in enumerate(sorted(series.items())):
        coords = " ".join(f"{x(p.at):.1f},{y(p.value):.1f}" for p in points)
        chart.lines.append(Line(name, PALETTE[i % len(PALETTE)], coords))
    for k in range(5):
        v = y_max * k / 4
        text = (label or format_duration)(v) if v else "0"
        chart.y_ticks.append(Tick(y(v), text))
    for k in range(5):
        at = start + (end - start) * k / 4
        when = at.strftime("%H:%M") if span <= 2 * 86400 else at.strftime("%d %b %H:%M")
        anchor = "start" if k == 0 else "end" if k == 4 else "middle"
        chart.x_ticks.append(Tick(x(at), when, anchor))
    return chart
