"""The report's plots as inline SVG (matplotlib), each with the table of the numbers it draws.

The figures are made with matplotlib's object API (no pyplot, so no global figure state and
no GUI backend), text kept as SVG text, and a fixed hash salt, so the same data gives the same
bytes.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

SVG_SETTINGS = {"svg.fonttype": "none", "svg.hashsalt": "hwrun-report", "font.size": 9}
COLORS = ("#3b6ea8", "#e08a2c", "#5a9e4b", "#b8433d")


@dataclass(frozen=True)
class Plot:
    """One figure and the numbers behind it (``header`` and ``rows`` of the table beside it)."""

    id: str
    title: str
    svg: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def capacity_plots(section: dict[str, Any]) -> list[Plot]:
    """Bytes per token by format, pool tokens under TP vs DCP, concurrency at 128K and 1M."""
    model = section["model"]
    slug = model.replace(".", "-")
    plots = []
    rows = section["bytes_per_token"]
    labels = [f"{r['latent_format'] or '-'} / {r['index_format'] or '-'}" for r in rows]
    plots.append(
        Plot(
            f"bytes-{slug}",
            f"{model}: KV bytes per token per GPU at TP1, by latent / index-key format",
            _stacked_bars(
                labels,
                {
                    "latent": [r["latent"] for r in rows],
                    "index keys": [r["index_keys"] for r in rows],
                },
                "bytes per token",
            ),
            ("latent / index keys", "latent B", "index keys B", "total B", "KDA state B/request"),
            tuple(
                (
                    label,
                    _num(r["latent"]),
                    _num(r["index_keys"]),
                    _num(r["total"]),
                    _num(r["kda_state_per_request"]),
                )
                for label, r in zip(labels, rows, strict=True)
            ),
        )
    )
    pool = [r for r in section["pool"] if "refused" not in r]
    gpus = sorted({r["gpus"] for r in pool})
    by_mode = {mode: {r["gpus"]: r for r in pool if r["mode"] == mode} for mode in ("TP", "DCP")}
    budget = f"{section['kv_budget_per_gpu'] / 1e9:g} GB"
    plots.append(
        Plot(
            f"pool-{slug}",
            f"{model}: KV pool tokens of one replica, TP vs DCP ({budget} of KV per GPU)",
            _grouped_bars(
                [str(g) for g in gpus],
                {
                    mode: [rows_[g]["tokens_per_replica"] if g in rows_ else None for g in gpus]
                    for mode, rows_ in by_mode.items()
                },
                "GPUs",
                "pool tokens (millions)",
                scale=1e-6,
            ),
            ("GPUs", "mode", "TP", "DCP", "pool tokens", "requests at 128K", "requests at 1M"),
            tuple(
                (
                    str(r["gpus"]),
                    r["mode"],
                    str(r["tp"]),
                    str(r["dcp"]),
                    _num(r["tokens_per_replica"]),
                    _num(r["concurrent_128K"]),
                    _num(r["concurrent_1M"]),
                )
                for r in pool
            ),
        )
    )
    series = {}
    for mode, rows_ in by_mode.items():
        for label in ("128K", "1M"):
            series[f"{mode} at {label}"] = [
                rows_[g][f"concurrent_{label}"] if g in rows_ else None for g in gpus
            ]
    plots.append(
        Plot(
            f"concurrency-{slug}",
            f"{model}: concurrent requests at 128K and 1M tokens ({budget} of KV per GPU)",
            _grouped_bars([str(g) for g in gpus], series, "GPUs", "whole requests"),
            ("GPUs", *series),
            tuple(
                (str(g), *(_num(values[i]) for values in series.values()))
                for i, g in enumerate(gpus)
            ),
        )
    )
    return plots


def bench_plots(benches: list[dict[str, Any]]) -> list[Plot]:
    """Per bench file: percent of roofline per op and shape, and hwrun's time over each peer's."""
    plots = []
    for number, bench in enumerate(benches):
        rows = bench["rows"]
        with_roof = [r for r in rows if r["percent_of_roofline"] is not None]
        labels = [f"{r['op']} {r['shape']}" for r in with_roof]
        where = f"{bench['card']}, {bench['date']}, commit {bench['commit']}"
        if with_roof:
            plots.append(
                Plot(
                    f"roofline-{number}",
                    f"{bench['bench']}: % of roofline ({where})",
                    _hbars(labels, [r["percent_of_roofline"] for r in with_roof], "% of roofline"),
                    ("op", "shape", "impl", "us", "% of roofline"),
                    tuple(
                        (
                            r["op"],
                            r["shape"],
                            r["impl"],
                            f"{r['us']:.1f}",
                            f"{r['percent_of_roofline']:.0f}%",
                        )
                        for r in with_roof
                    ),
                )
            )
        pairs = [(r, peer, ratio) for r in rows for peer, ratio in r["vs_peer"].items()]
        if pairs:
            plots.append(
                Plot(
                    f"peers-{number}",
                    f"{bench['bench']}: hwrun time / peer time, below 1 is faster ({where})",
                    _hbars(
                        [f"{r['op']} {r['shape']} vs {peer}" for r, peer, _ in pairs],
                        [ratio for _, _, ratio in pairs],
                        "hwrun / peer (log scale)",
                        log=True,
                        reference=1.0,
                    ),
                    ("op", "shape", "impl", "us", "peer", "peer us", "hwrun / peer"),
                    tuple(
                        (
                            r["op"],
                            r["shape"],
                            r["impl"],
                            f"{r['us']:.1f}",
                            peer,
                            f"{r['peers'][peer]:.1f}",
                            f"{ratio:.2f}x",
                        )
                        for r, peer, ratio in pairs
                    ),
                )
            )
    return plots


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


def _figure(height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(6.4, height), layout="constrained")


def _svg(fig: Any) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # inline: no XML declaration or doctype


def _stacked_bars(labels: list[str], series: dict[str, list[float]], ylabel: str) -> str:
    import matplotlib

    with matplotlib.rc_context(SVG_SETTINGS):
        fig = _figure(3.2)
        ax = fig.add_subplot()
        bottom = [0.0] * len(labels)
        for color, (name, values) in zip(COLORS, series.items(), strict=False):
            ax.bar(labels, values, bottom=bottom, label=name, color=color)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_ylabel(ylabel)
        ax.tick_params(axis="x", labelrotation=60)
        for tick in ax.get_xticklabels():
            tick.set_horizontalalignment("right")
        ax.legend()
        return _svg(fig)


def _grouped_bars(
    groups: list[str],
    series: dict[str, list[float | None]],
    xlabel: str,
    ylabel: str,
    scale: float = 1.0,
) -> str:
    import matplotlib

    with matplotlib.rc_context(SVG_SETTINGS):
        fig = _figure(3.0)
        ax = fig.add_subplot()
        width = 0.8 / max(len(series), 1)
        for i, (color, (name, values)) in enumerate(zip(COLORS, series.items(), strict=False)):
            xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
            heights = [0 if v is None else v * scale for v in values]  # None: not planned
            ax.bar(xs, heights, width, label=name, color=color)
        ax.set_xticks(range(len(groups)), groups)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend()
        return _svg(fig)


def _hbars(
    labels: list[str],
    values: list[float],
    xlabel: str,
    log: bool = False,
    reference: float | None = None,
) -> str:
    import matplotlib

    with matplotlib.rc_context(SVG_SETTINGS):
        fig = _figure(0.8 + 0.22 * len(labels))
        ax = fig.add_subplot()
        ys = list(range(len(labels)))
        ax.barh(ys, values, color=COLORS[0])
        ax.set_yticks(ys, labels)
        ax.invert_yaxis()
        if log:
            ax.set_xscale("log")
        if reference is not None:
            ax.axvline(reference, color=COLORS[3], linewidth=1)
        ax.set_xlabel(xlabel)
        return _svg(fig)
