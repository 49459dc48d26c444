"""The score-against-latency plot of a report, and when one model beats another on both.

A model is worth more than another only when it is faster *and* scores higher; the plot draws the
frontier of the models nothing beats in that sense (the Pareto frontier).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from distillery.errors import DistilleryError
from distillery.folders import atomic_file


def dominates(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """``a`` is strictly faster (latency) and strictly better (main metric) than ``b``.

    Strict on both, as a user means "faster *and* more accurate": a tie in score is not a win.
    """
    if None in (a.get("latency_ms"), a.get("main"), b.get("latency_ms"), b.get("main")):
        return False
    return a["latency_ms"] < b["latency_ms"] and a["main"] > b["main"]


def _point(p: Any) -> tuple[str, float, float]:
    if isinstance(p, Mapping):
        return str(p["label"]), float(p["latency_ms"]), float(p["metric"])
    label, latency, metric = p
    return str(label), float(latency), float(metric)


def pareto_front(points: Iterable[Any]) -> list[tuple[str, float, float]]:
    """The points no other point beats on both lower latency and higher metric, fastest first."""
    pts = sorted((_point(p) for p in points), key=lambda t: (t[1], -t[2]))
    front, best = [], -math.inf
    for label, latency, metric in pts:
        if metric > best:
            front.append((label, latency, metric))
            best = metric
    return front


def write_plot(points: Iterable[Any], path: str | os.PathLike, metric_name: str, title: str | None = None,
               **marks: Any) -> Path:
    """Main metric (y) against latency in ms (x, log scale), every point labelled, Pareto
    frontier drawn. ``points``: dicts ``{"label", "latency_ms", "metric"}`` or such triples.
    ``marks``: :func:`plot_figure`'s ``x_label``, ``chosen``, ``target_x`` and ``label_only``."""
    fig = plot_figure(points, metric_name, title, **marks)
    path = Path(path)
    with atomic_file(path) as f:  # a reader never finds half a plot
        fig.savefig(f, format="png")
    return path


def plot_figure(points: Iterable[Any], metric_name: str, title: str | None = None, *,
                x_label: str = "latency (ms, lower is better)", chosen: str | None = None,
                target_x: float | None = None, label_only: Iterable[str] | None = None):
    """The figure :func:`write_plot` saves. ``chosen``: the label of a point to ring and name in the legend;
    ``target_x``: a vertical line where a target lies (points left of it meet it); ``label_only``: the
    labels written beside their points (the others are listed in the report), so that a crowded plot
    stays readable."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    pts = [_point(p) for p in points]
    pts = [p for p in pts if p[1] > 0 and math.isfinite(p[1]) and math.isfinite(p[2])]
    if not pts:
        raise DistilleryError("There is no model with both a latency and a score to plot.")
    # A bare Figure on the Agg canvas: no pyplot state, no display needed, safe beside other plots.
    fig = Figure(figsize=(7, 4.8), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs, ys = [p[1] for p in pts], [p[2] for p in pts]
    ax.scatter(xs, ys, s=36, color="tab:blue", zorder=3)
    # Points at the same place (one teacher measured in several runs) share one label.
    labels: dict[tuple[float, float], list[str]] = {}
    for label, x, y in pts:
        labels.setdefault((round(x, 6), round(y, 6)), []).append(label)
    # Labels of neighbouring points (a model and its int8 variant) alternate above and below.
    shown = None if label_only is None else set(label_only) | ({chosen} if chosen else set())
    for i, ((x, y), names) in enumerate(sorted(labels.items())):
        names = [n for n in names if shown is None or n in shown]
        if not names:
            continue
        ax.annotate(_literal(", ".join(dict.fromkeys(names))), (x, y), textcoords="offset points",
                    xytext=(5, 5 if i % 2 == 0 else -12), fontsize=8)
    front = pareto_front(pts)
    if len(front) > 1:
        ax.step([p[1] for p in front], [p[2] for p in front], where="post", color="tab:orange",
                linestyle="--", zorder=2, label="Pareto frontier")
    picked = [p for p in pts if p[0] == chosen]
    if picked:
        ax.scatter([picked[0][1]], [picked[0][2]], s=160, facecolors="none", edgecolors="tab:red", linewidths=2,
                   zorder=4, label=_literal(f"chosen: {chosen}"))
    if target_x is not None and math.isfinite(target_x) and target_x > 0:
        ax.axvline(target_x, color="tab:green", linestyle=":", zorder=1, label="target")
        xs = xs + [target_x]
    if len(front) > 1 or picked or target_x is not None:
        ax.legend(loc="lower right", fontsize=8)
    if max(xs) / min(xs) > 3:
        ax.set_xscale("log")
        # labels at 1, 2 and 5 of each decade (1 and 10 only beyond three decades), none at the other minor
        # ticks: labelled minor ticks ran into each other ("0.30.4.0.50.6")
        subs = (1.0, 2.0, 5.0) if max(xs) / min(xs) < 1000 else (1.0,)
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    pad = (max(xs) / min(xs)) ** 0.08 if max(xs) > min(xs) else 1.2
    ax.set_xlim(min(xs) / pad, max(xs) * pad * pad)
    ax.set_xlabel(_literal(x_label))
    ax.set_ylabel(_literal(f"{metric_name} (higher is better)"))
    if title:
        ax.set_title(_literal(title), fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def _literal(text: str) -> str:
    """``text`` shown as it is: a run's name or setting between two "$" would be read as mathtext
    (and a malformed formula fails when the figure is drawn)."""
    return text.replace("$", r"\$")


def plot_points(rows: Sequence[Mapping[str, Any]], label_key: str = "model") -> list[dict[str, Any]]:
    """The points of a report's rows that have both a latency and a score."""
    return [
        {"label": str(r[label_key]), "latency_ms": r["latency_ms"], "metric": r["main"]}
        for r in rows
        if r["latency_ms"] and r["main"] is not None
    ]
