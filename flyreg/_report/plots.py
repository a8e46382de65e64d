"""The report's plots, drawn by matplotlib (the optional extra ``flyreg[report]``) as PNG data URIs.

Each plot has a spec per column; an op with many specs gets one figure per :data:`PER_FIGURE` of them.
Labels come from specs, which hold any text: they are drawn as plain text (no mathtext) and cut to
:data:`LABEL_CHARS`.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Sequence
from typing import Any

from flyreg._core.config import JSONScalar
from flyreg._report.data import OpReport, SpecResult

#: Specs per figure, so each column keeps a readable label.
PER_FIGURE = 48
#: The most characters of a column's label.
LABEL_CHARS = 60
SERVED, DEFAULT, OTHER = "#1a7f37", "#cf222e", "#57606a"


def missing_matplotlib() -> str | None:
    """Why the plots cannot be drawn here (one line), or None when matplotlib imports."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        return (f"flyreg report draws its plots with matplotlib, which is not installed here ({e}); "
                f"install it with: pip install 'flyreg[report]'")
    return None


def spec_labels(specs: Sequence[dict[str, JSONScalar]]) -> list[str]:
    """Each spec as a short label: only the axes whose values differ between the specs."""
    axes = sorted({k for s in specs for k in s})
    varying = [k for k in axes if len({repr(s.get(k)) for s in specs}) > 1] or axes
    labels = [" ".join(f"{k}={s[k]}" for k in varying if k in s) for s in specs]
    return [label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "\u2026" for label in labels]


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=96, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _figures(specs: list[SpecResult], title: str, ylabel: str,
             draw: Callable[[Any, int, SpecResult], None], log: bool = False,
             line: float | None = None) -> list[str]:
    """One PNG per :data:`PER_FIGURE` specs: ``draw(axes, column, spec)`` draws each column."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = spec_labels([s.spec for s in specs])
    out = []
    for start in range(0, len(specs), PER_FIGURE):
        chunk = specs[start:start + PER_FIGURE]
        fig, ax = plt.subplots(figsize=(max(3.2, 1.2 + 0.28 * len(chunk)), 3.2))
        for i, s in enumerate(chunk):
            draw(ax, i, s)
        if line is not None:
            ax.axhline(line, color=OTHER, linewidth=0.8, linestyle="--")
        if log:
            ax.set_yscale("log")
        ax.set_xticks(range(len(chunk)))
        ax.set_xticklabels(labels[start:start + PER_FIGURE], rotation=60, ha="right", fontsize=7, parse_math=False)
        ax.set_xlim(-0.6, len(chunk) - 0.4)
        ax.set_ylabel(ylabel)
        part = f" ({start + 1}-{start + len(chunk)} of {len(specs)})" if len(specs) > PER_FIGURE else ""
        ax.set_title(title + part, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        out.append(_png(fig))
    return out


def speedup_plots(report: OpReport) -> list[str]:
    """The served config's speedup over the default, per spec."""
    shown = [s for s in report.specs if s.speedup is not None]

    def draw(ax: Any, i: int, s: SpecResult) -> None:
        ax.bar(i, s.speedup, width=0.6, color=SERVED if (s.speedup or 0) > 1 else OTHER)

    return _figures(shown, "served vs default", "default time / served time", draw, line=1.0) \
        if shown else []


def spread_plots(report: OpReport) -> list[str]:
    """Every measured config's band (p20 to p80, a line through its median) over the served config's time
    (the fastest measured where none is served), per spec: the served config, the default, the others."""

    def base_ms(s: SpecResult) -> float | None:
        fastest = s.band(s.fastest)
        return s.served_ms or (fastest.median if fastest is not None else None)

    shown = [s for s in report.specs if base_ms(s)]

    def draw(ax: Any, i: int, s: SpecResult) -> None:
        base = base_ms(s) or 1.0
        served = s.served.config if s.served is not None else None
        others = [s.band(c) for c in s.bands if c not in (served, s.default)]
        n = len(others)
        xs = [i + (k - (n - 1) / 2) * min(0.6 / max(n, 1), 0.08) for k in range(n)]
        ax.vlines(xs, [b.p20 / base for b in others], [b.p80 / base for b in others], color=OTHER, alpha=0.4,
                  linewidth=1)
        ax.scatter(xs, [b.median / base for b in others], s=9, color=OTHER, alpha=0.6, linewidths=0)
        marks = [(s.default, "D", DEFAULT, i + 0.15)] if s.default is not None and s.default != served else []
        for config, marker, color, at in [*marks, (served, "*", SERVED, i)]:
            band = s.band(config) if config is not None else None
            if band is None:
                continue
            ax.vlines([at], [band.p20 / base], [band.p80 / base], color=color, linewidth=1.5, zorder=3)
            ax.scatter([at], [band.median / base], s=30, marker=marker, color=color, zorder=4)

    return _figures(shown, "every config measured, p20 to p80 (\u2605 served, \u25c6 default)",
                    "time / served time", draw, log=True) if shown else []


def bound_plots(report: OpReport) -> list[str]:
    """The served config's throughput as a fraction of the peak stored at tuning time, per spec that states its work."""
    fractions = {id(s): s.of_bound(report.peak) for s in report.specs}
    shown = [s for s in report.specs if fractions[id(s)] is not None]

    def draw(ax: Any, i: int, s: SpecResult) -> None:
        ax.bar(i, fractions[id(s)], width=0.6, color=SERVED)

    return _figures(shown, "served vs the peak stored at tuning", "fraction of the bound", draw, line=1.0) \
        if shown else []
