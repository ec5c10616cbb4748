"""Draws `train`'s log as a small SVG: LM loss per step (train batches and held-out evaluations,
phases shaded) above the indexer's KL. Plain SVG text, so it needs no plotting library.

    python -m hwrun.default_model.train.loss_curve --log training_log.json --out loss_curve.svg
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

WIDTH, PANEL, GAP, LEFT, TOP = 640, 220, 40, 50, 24
PHASE_FILL = {"dense": "#f4f4f4", "warmup": "#fdf0d5", "sparse": "#e3f0fb"}
COLOURS = {"train": "#1f77b4", "heldout": "#d62728", "kl": "#2ca02c"}


def _polyline(points: list[tuple[float, float]], colour: str, dots: bool = False) -> str:
    if dots:
        return "".join(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>' for x, y in points
        )
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.2"/>'


def _panel(
    top: float, series: dict, y_range: tuple[float, float], steps: int, phases: list, label: str
):
    lo, hi = y_range
    inner = WIDTH - LEFT - 10

    def xy(step: float, value: float) -> tuple[float, float]:
        v = min(max(value, lo), hi)
        return LEFT + inner * step / steps, top + PANEL * (1 - (v - lo) / (hi - lo))

    out, start = [], 0
    for name, count in phases:
        x0, x1 = xy(start, lo)[0], xy(start + count, lo)[0]
        box = f'x="{x0:.1f}" y="{top}" width="{x1 - x0:.1f}" height="{PANEL}"'
        out.append(f'<rect {box} fill="{PHASE_FILL[name]}"/>')
        out.append(f'<text x="{x0 + 4:.1f}" y="{top + 12}" font-size="10">{name}</text>')
        start += count
    for tick in range(5):
        value = lo + (hi - lo) * tick / 4
        y = xy(0, value)[1]
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + inner}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ccc"/>'
        )
        at = f'x="{LEFT - 6}" y="{y + 3:.1f}"'
        out.append(f'<text {at} font-size="10" text-anchor="end">{value:.2f}</text>')
    for name, (points, dots) in series.items():
        out.append(_polyline([xy(s, v) for s, v in points], COLOURS[name], dots))
    out.append(f'<text x="{LEFT}" y="{top - 6}" font-size="11">{label}</text>')
    return out


def render(log: dict) -> str:
    steps = log["total_steps"]
    phases = [(p["phase"], p["steps"]) for p in log["phases"]]
    train = [(r["step"], r["loss"]) for r in log["steps"]]
    held = [(e["step"], e["loss"]) for e in log["evals"]]
    kl = [(r["step"], r["indexer_kl"]) for r in log["steps"] if r["indexer_kl"] is not None]
    height = TOP + 2 * PANEL + GAP + 30
    body = _panel(
        TOP,
        {"train": (train, False), "heldout": (held, True)},
        (1.0, 4.0),
        steps,
        phases,
        "LM loss, nats/token (blue: train batches; red: held-out, 64 windows)",
    )
    body += _panel(
        TOP + PANEL + GAP,
        {"kl": (kl, False)},
        (0.0, 0.4),
        steps,
        phases,
        "indexer KL to the main attention (mean over layers; warm-up starts at 2.5)",
    )
    body.append(
        f'<text x="{WIDTH // 2}" y="{height - 6}" font-size="11" text-anchor="middle">step</text>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
        + "".join(body)
        + "</svg>\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.write_text(render(json.loads(args.log.read_text())))


if __name__ == "__main__":
    main()
