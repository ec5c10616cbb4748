"""The benchmark section: hwrun against its peers and against the roofline, per op and shape,
from the JSON files the GPU benchmarks write.

Accepted files (``--bench``):

- an envelope ``{"schema": "hwrun.bench/1", "bench": NAME, "card": ..., "date": ...,
  "commit": ..., "rows": [...]}`` (what ``bench/gpu_ops.py``, ``bench/moe_gpu.py`` and
  ``bench/engine_decode.py`` write with ``--out`` / ``--json``);
- a bare list of rows, as earlier versions of those scripts wrote: card, date and commit are
  then "not recorded", and the report says so.

Rows are op rows (``op, shape, impl, us, floor_us`` or ``percent_of_roofline``, ``peers``:
name -> us, ``note``) or engine decode rows (``batch, context, topk, tpot_ms, roofline_ms``),
which become the op ``engine.decode_step``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hwrun.errors import UsageError
from hwrun.provenance import source_commit

BENCH_SCHEMA = "hwrun.bench/1"
NOT_RECORDED = "not recorded"


def bench_file(bench: str, card: str, rows: list[dict[str, Any]]) -> str:
    """A benchmark run's rows as ``--bench`` reads them, with the card (the script's own line:
    device, measured ceilings, versions), today's date and the source commit beside them."""
    envelope = {
        "schema": BENCH_SCHEMA,
        "bench": bench,
        "card": card,
        "date": datetime.now(UTC).date().isoformat(),
        "commit": source_commit(),
        "rows": rows,
    }
    return json.dumps(envelope, indent=1) + "\n"


def load_bench(path: str) -> dict[str, Any]:
    """One bench file as the report lists it; a file it cannot read is a usage error that
    says which forms it accepts."""
    file = Path(path)
    try:
        data = json.loads(file.read_text())
    except OSError as err:
        raise UsageError(f"{path}: cannot read the bench file ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise UsageError(f"{path}: not JSON ({err.msg})") from None
    if isinstance(data, list):
        meta: dict[str, Any] = {"bench": file.stem}
        raw_rows = data
    elif isinstance(data, dict) and data.get("schema") == BENCH_SCHEMA:
        meta = data
        raw_rows = data.get("rows", [])
    else:
        raise UsageError(
            f"{path}: not a bench file; expected a list of rows or an object with "
            f'"schema": "{BENCH_SCHEMA}" and "rows"'
        )
    rows = [_row(path, i, raw) for i, raw in enumerate(raw_rows)]
    return {
        "path": str(path),
        "bench": meta.get("bench") or file.stem,
        "card": meta.get("card") or NOT_RECORDED,
        "date": meta.get("date") or NOT_RECORDED,
        "commit": meta.get("commit") or NOT_RECORDED,
        "source": meta.get("source"),
        "rows": rows,
    }


def _row(path: str, index: int, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: row {index} is {type(raw).__name__}, not an object")
    if "tpot_ms" in raw:
        raw = {
            "op": "engine.decode_step",
            "shape": f"B={raw['batch']} ctx={raw['context']} topk={raw.get('topk', '?')}",
            "impl": "hwrun engine",
            "us": raw["tpot_ms"] * 1e3,
            "floor_us": raw["roofline_ms"] * 1e3 if "roofline_ms" in raw else None,
            "percent_of_roofline": raw.get("percent_of_roofline"),
            "note": f"{raw['tokens_per_s']:.0f} output tok/s" if "tokens_per_s" in raw else "",
        }
    missing = [k for k in ("op", "shape", "impl", "us") if k not in raw]
    if missing:
        raise UsageError(
            f"{path}: row {index} lacks {', '.join(missing)} (op rows have op, shape, impl, us; "
            "decode rows batch, context, tpot_ms)"
        )
    us = float(raw["us"])
    floor = raw.get("floor_us")
    percent = raw.get("percent_of_roofline")
    if floor is not None and us > 0:
        percent = 100.0 * float(floor) / us
    peers = {str(k): float(v) for k, v in (raw.get("peers") or {}).items()}
    return {
        "op": raw["op"],
        "shape": raw["shape"],
        "impl": raw["impl"],
        "us": us,
        "floor_us": None if floor is None else float(floor),
        "percent_of_roofline": None if percent is None else float(percent),
        "peers": peers,
        # hwrun's time over each peer's: below 1 hwrun is faster
        "vs_peer": {name: us / peer for name, peer in peers.items() if peer > 0},
        "note": raw.get("note", ""),
    }
