"""The report page: one self-contained HTML file (inline style, plots as PNG data URIs, no script)."""

from __future__ import annotations

import datetime
import html
from collections.abc import Iterable, Sequence

from flyreg._core.decision import Band
from flyreg._core.spec import spec_arg
from flyreg._core.text import config_str
from flyreg._report.data import OpReport, SpecResult
from flyreg._report.plots import bound_plots, speedup_plots, spread_plots
from flyreg._version import __version__

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #1f2328; }
h1 { font-size: 1.6em; } h2 { font-size: 1.3em; border-bottom: 1px solid #d0d7de; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; white-space: nowrap; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f6f8fa; } .facts td:first-child { font-weight: 600; }
.missing { color: #cf222e; } .stale { color: #9a6700; } .current { color: #1a7f37; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.plots img { max-width: 100%; } .note { color: #57606a; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.3f} ms"


def _x(value: float | None, digits: int = 2, suffix: str = "x") -> str:
    return f"{value:.{digits}f}{suffix}" if value is not None else "-"


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[bool] = ()) -> str:
    """An HTML table; cells are already escaped."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td class='n'>{c}</td>" if i < len(numeric) and numeric[i] else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def achieved(s: SpecResult) -> str:
    """The served config's throughput from the work the op states: GB/s and/or TFLOP/s."""
    w, ms = s.work, s.served_ms
    if w is None or not ms:
        return "-"
    parts = []
    if w.bytes is not None:
        parts.append(f"{w.bytes / ms / 1e6:.1f} GB/s")
    if w.flops is not None:
        parts.append(f"{w.flops / ms / 1e9:.2f} TFLOP/s")
    return ", ".join(parts)


def _band(band: Band | None) -> str:
    """``12.3 us (11.9 us to 12.8 us)``: a median and its p20 to p80."""
    if band is None:
        return "-"
    return f"{_ms(band.median)} ({_ms(band.p20)} to {_ms(band.p80)})"


def _why(s: SpecResult) -> str:
    """Why the served config is served, or why none is."""
    if s.served is None:
        fastest = f"; the fastest measured: {config_str(s.fastest)}" if s.fastest is not None else ""
        return f"no artifact: lookup serves none of these{fastest}"
    stale = " (stale: tuned with another toolchain)" if s.served.stale else ""
    if s.decision is None:
        return f"artifact written before flyreg recorded its decisions{stale}"
    return f"{s.decision.reason}; timed {s.decision.timing}{stale}"


def _spec_rows(report: OpReport) -> list[list[str]]:
    rows = []
    for s in report.specs:
        default = config_str(s.default) if s.default is not None else "-"
        served = s.served.config if s.served is not None else None
        rows.append([_e(spec_arg(s.spec)), _e(config_str(served)) if served is not None else "-",
                     _band(s.band(served)), _e(_why(s)), _e(default), _band(s.band(s.default)), _x(s.speedup),
                     _e(achieved(s)), _x(s.of_bound(report.peak), 2, ""), str(len(s.times)), str(len(s.failed)),
                     _seconds(s.span_s)])
    return rows


def _coverage(report: OpReport) -> str:
    workloads = [c for c in report.coverage if c.workload]
    counts = {state: sum(1 for c in workloads if c.state == state) for state in ("current", "stale", "missing")}
    line = (f"<p>{len(workloads)} workload(s) declared for {_e(report.device.name)}: "
            + ", ".join(f"<span class='{k}'>{n} {k}</span>" for k, n in counts.items()) + "</p>")
    rows = [[_e(spec_arg(c.spec)), f"<span class='{c.state}'>{c.state}</span>",
             "workload" if c.workload else "journal only", _e(c.path or "-")]
            for c in report.coverage if c.state != "current"]
    if not rows:
        return line + "<p>Every workload and every tuned spec has a current artifact.</p>"
    return line + _table(["spec with no current artifact", "state", "from", "artifact"], rows)


def _images(title: str, images: list[str]) -> str:
    return "".join(f"<img alt='{_e(title)}' src='{src}'>" for src in images)


def op_section(report: OpReport) -> str:
    """One op on one device: facts, plots, the spec table and the coverage."""
    superseded = sum(s.superseded for s in report.specs)
    facts = [
        ("device", f"{report.device.name} ({report.device.arch})"),
        ("peak", "; ".join(report.peaks)),
        ("specs tuned", str(len(report.specs))),
        ("tuning cost", f"{report.timed} configs timed ({sum(s.retimed for s in report.specs)} re-timed in final "
                        f"rounds), {report.failures} failed or rejected, {_seconds(report.span_s)} of measuring "
                        f"(journaled, pauses over 5 min left out)"),
    ]
    if superseded:
        facts.append(("not shown", f"{superseded} measurement(s) of older toolchains or timing methods"))
    if report.note:
        facts.append(("note", f"the op is not usable here ({report.note}): no default, work or coverage"))
    parts = [f"<h2 id='{_e(report.op)}-{_e(report.device.name)}'>{_e(report.op)} on {_e(report.device.name)}</h2>",
             "<table class='facts'>" + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in facts)
             + "</table>",
             "<div class='plots'>" + _images("speedup", speedup_plots(report)) + _images("spread", spread_plots(report))
             + _images("bound", bound_plots(report)) + "</div>",
             _table(["spec", "served", "time (p20-p80)", "why", "default", "default time (p20-p80)", "vs default",
                     "achieved", "of bound", "timed", "failed", "measuring"], _spec_rows(report),
                    [False, False, True, False, False, True, True, True, True, True, True, True]),
             "<h3>Coverage</h3>", _coverage(report) if report.coverage or not report.note else ""]
    return "\n".join(parts)


def page(reports: list[OpReport], journal: str) -> str:
    """The whole report page."""
    when = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    index = "".join(f"<li><a href='#{_e(r.op)}-{_e(r.device.name)}'>{_e(r.op)} on {_e(r.device.name)}</a>: "
                    f"{len(r.specs)} spec(s)</li>" for r in reports)
    notes = ("<p class='note'>The served config is the one the spec's artifact holds, what lookup serves; "
             "why names the rule its search chose it by. Times are medians per call with their middle reps "
             "(p20 to p80); a config's final-round time replaces its first. The served and default times are "
             "those the search compared, as the artifact stores them. The bound is the longer of bytes / peak "
             "bandwidth and flops / peak FLOP/s from the work the op states, with the peak stored when the "
             "spec was tuned; a fraction above 1 means the data stayed in a cache, or the peak is a measured "
             "copy bandwidth below the device's best.</p>")
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>flyreg report</title>"
            f"<style>{STYLE}</style></head><body><h1>flyreg report</h1>"
            f"<p class='note'>flyreg {_e(__version__)}, {_e(when)}, from the tuning journal {_e(journal)}</p>"
            f"<ul>{index}</ul>{notes}" + "\n".join(op_section(r) for r in reports) + "</body></html>")
