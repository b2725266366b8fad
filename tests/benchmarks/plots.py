"""The report's plots: session time, transcript bytes and peak memory against table size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator

from .fmt import median, p95

STYLE = {
    "dataref": {"color": "#1f77b4", "marker": "o", "label": "dataref"},
    "seed": {"color": "#ff7f0e", "marker": "s", "label": "seed-style baseline"},
    "naive": {"color": "#d62728", "marker": "^", "label": "naive (rows as JSON)"},
}


def _series(results: dict[str, Any], name: str, *path: str) -> tuple[list[int], list[Any]]:
    """(rows, value) for every table size where the server has ``path``."""
    xs, ys = [], []
    for scale in results["scales"]:
        node: Any = results["servers"].get(name, {}).get(scale, {})
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            rows = results["servers"][name][scale]["session"].get("rows")
            xs.append(rows or 0)
            ys.append(node)
    return xs, ys


def _bytes_label(x: float, _pos: int) -> str:
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if x >= scale:
            return f"{x / scale:g} {unit}"
    return f"{x:g} B"


def _axes(title: str, ylabel: str, *, bytes_axis: bool = False) -> tuple[plt.Figure, plt.Axes]:
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rows in the fetched table")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    # Plain numbers on the axes (1,000 rather than 10^3) are easier to read off.
    plain = FuncFormatter(lambda x, _pos: f"{x:,.0f}" if x >= 1 else f"{x:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.yaxis.set_major_locator(
        LogLocator(base=10, subs=(1.0,) if bytes_axis else (1.0, 2.0, 3.0, 5.0))
    )
    ax.yaxis.set_major_formatter(FuncFormatter(_bytes_label) if bytes_axis else plain)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda x, _pos: ""))
    return fig, ax


def latency_plot(results: dict[str, Any], path: Path) -> None:
    fig, ax = _axes("Article session end to end (median, bar to p95)", "seconds")
    for name in ("dataref", "seed", "naive"):
        xs, runs = _series(results, name, "session", "seconds")
        if not xs:
            continue
        mids = [median(r) for r in runs]
        upper = [p95(r) - m for r, m in zip(runs, mids, strict=True)]
        label = STYLE[name]["label"] + (" — fetch only" if name == "naive" else "")
        style = {**STYLE[name], "label": label}
        ax.errorbar(xs, mids, yerr=[[0] * len(mids), upper], capsize=3, **style)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def bytes_plot(results: dict[str, Any], path: Path) -> None:
    fig, ax = _axes(
        "Bytes reaching the transcript per session", "fetch + QoQ + chain", bytes_axis=True
    )
    for name in ("dataref", "seed", "naive"):
        xs, ys = _series(results, name, "session", "bytes")
        if xs:
            ax.plot(xs, ys, **STYLE[name])
    ax.axhline(2048, color="grey", linestyle="--", linewidth=1, label="2 KB target")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def memory_plot(results: dict[str, Any], path: Path) -> None:
    fig, ax = _axes("Peak memory (VmHWM)", "MiB")
    for name in ("dataref", "seed"):
        for key, dash, what in (("server_mib", "-", "server"), ("kernel_max_mib", ":", "kernel")):
            xs, ys = _series(results, name, "memory", key)
            if xs and any(ys):
                what = "runner" if name == "seed" and what == "kernel" else what
                style = {**STYLE[name], "label": f"{STYLE[name]['label']}: {what}"}
                ax.plot(xs, ys, linestyle=dash, **style)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_plots(results: dict[str, Any], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    latency_plot(results, directory / "latency_vs_rows.png")
    bytes_plot(results, directory / "bytes_vs_rows.png")
    memory_plot(results, directory / "memory_vs_rows.png")
