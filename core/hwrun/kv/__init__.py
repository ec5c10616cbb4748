"""KV state of hybrid sparse models: layer specs, the packed block planner, views, capacity.

- ``specs``: LayerSpec and its parts (latent, index keys, KDA state, sliding window), ModelSpec.
- ``footprint``: bytes per token and per request on one GPU under TP / DCP.
- ``layout``: ``plan_packed_layout(model, tp, dcp) -> PackedLayout``, the packed row.
- ``views``: the cache tensor, strided page views, kernel-page pools and id translation.
- ``capacity``: KV budget, pool tokens, concurrent requests, decode bytes read.
- ``plan_report``: the whole plan of a model as data (``hwrun plan`` prints it).
"""

from hwrun.kv.capacity import Capacity, decode_read_fraction, kv_budget, plan_capacity
from hwrun.kv.errors import PlanError
from hwrun.kv.footprint import Footprint, footprint
from hwrun.kv.layout import PackedLayout, Page, plan_packed_layout
from hwrun.kv.specs import (
    IndexKeySpec,
    KDAStateSpec,
    LatentSpec,
    LayerSpec,
    ModelSpec,
    SlidingWindowSpec,
)

__all__ = [
    "Capacity",
    "Footprint",
    "IndexKeySpec",
    "KDAStateSpec",
    "LatentSpec",
    "LayerSpec",
    "ModelSpec",
    "PackedLayout",
    "Page",
    "PlanError",
    "SlidingWindowSpec",
    "decode_read_fraction",
    "footprint",
    "kv_budget",
    "plan_capacity",
    "plan_packed_layout",
]
