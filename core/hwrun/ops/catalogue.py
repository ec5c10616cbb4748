"""The op catalogue: every contract the core defines, collected from the op modules.

Each op module exposes ``CONTRACTS: list[OpContract]``; adding an op family means adding its
module name here.
"""

from __future__ import annotations

import importlib

from hwrun.ops.contract import OpContract

OP_MODULES: tuple[str, ...] = (
    "moe",
    "topk",
    "attn",
    "kda",
    "kv_write",
    "indexer",
    "sparse_mla",
    "linear",
)


def catalogue() -> dict[str, OpContract]:
    """Every contract, by op name, in catalogue order."""
    contracts: dict[str, OpContract] = {}
    for module_name in OP_MODULES:
        module = importlib.import_module(f"hwrun.ops.{module_name}")
        for contract in module.CONTRACTS:
            if contract.name in contracts:
                raise ValueError(f"op {contract.name!r} is defined twice (in {module_name})")
            contracts[contract.name] = contract
    return contracts
