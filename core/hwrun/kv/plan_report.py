"""The plan of a model as data: bytes per token, packed block layout and KV capacity.

``hwrun plan`` (:mod:`hwrun.commands.plan`) prints it; anything else may build it too.
"""

from __future__ import annotations

from typing import Any

from hwrun.kv.capacity import decode_read_fraction, plan_capacity, rows_per_request
from hwrun.kv.layout import plan_packed_layout
from hwrun.kv.specs import ModelSpec
from hwrun.kv.views import kernel_id_reasons


def plan_report(
    model: ModelSpec,
    tp: int,
    dcp: int,
    budget: int | None,
    context: int | None,
    **layout_options: int | None,
) -> dict[str, Any]:
    """The JSON-able plan of ``model``; PlanError / ValueError when it cannot be planned.

    ``layout_options`` go to plan_packed_layout (kernel_block_size, alignment, block_size).
    """
    layout = plan_packed_layout(model, tp, dcp, **layout_options)
    fp = layout.footprint
    latent = sorted({x.latent.format for x in model.layers if x.owns_latent})
    index = sorted({x.indexer.format for x in model.layers if x.owns_index_keys})
    report: dict[str, Any] = {
        "model": model.name,
        "tp": tp,
        "dcp": dcp,
        "latent_format": ",".join(latent) or None,
        "index_format": ",".join(index) or None,
        "layers": {
            "latent": fp.latent_layers,
            "index_keys": fp.index_layers,
            "kda": fp.kda_layers,
            "sliding_window": fp.window_layers,
        },
        "bytes_per_token_per_gpu": fp.per_global_token(),
        "bytes_per_request_per_gpu": {
            "kda": fp.kda_bytes_per_request,
            "sliding_window": fp.window_bytes_per_request,
        },
        "block_size": layout.block_size,
        "kernel_block_size": layout.kernel_block_size,
        "alignment": layout.alignment,
        "row_bytes": layout.row_bytes,
        "padding_bytes": layout.padding_bytes,
        "padding_fraction": layout.padding_fraction,
        "state_rows_per_request": layout.state_rows_per_request,
        "pages": [
            {
                "layer": p.layer,
                "kind": p.kind,
                "format": p.format,
                "offset": p.offset,
                "size": p.size,
            }
            for p in layout.pages
        ],
        "assumptions": list(model.assumptions),
    }
    if context is not None:
        report["context"] = context
        report["decode_read_fraction_vs_dense_mla"] = decode_read_fraction(model, context)
        report["rows_per_request"] = rows_per_request(layout, context)
    if budget is not None:
        cap = plan_capacity(layout, budget, context)
        report["kv_budget_per_gpu"] = budget
        report["num_blocks"] = cap.num_blocks
        report["tokens_per_gpu"] = cap.tokens_per_gpu
        report["tokens_per_cluster"] = cap.tokens_per_cluster
        report["warnings"] = kernel_id_reasons(layout, cap.num_blocks)
        if context is not None:
            report["concurrent_requests"] = cap.concurrent_requests
            report["context_fills"] = cap.context_fills
    return report
