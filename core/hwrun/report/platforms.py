"""The platform sections of the report: each plugin's identity and Target, the op x platform
matrix, and the formats each platform serves, asked of the registries as ``hwrun ops`` asks
them (each op's default spec placed on the platform's Target, so on this host's devices).

Nothing here runs an op: selection only calls each impl's ``validate``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from typing import Any

from hwrun.errors import UnsupportedError
from hwrun.plugins import PluginSet
from hwrun.registry import OpSpec
from hwrun.report.results import AUDIT_OP, ResultSource, state_of
from hwrun.target import Target

# What kind of code an impl is, by the names hwrun's own tiers register under; any other name
# is the platform's own (a vendor library adapter such as DeepGEMM, FlashMLA, AITER).
TIERS = {
    "reference": "reference",
    "triton": "portable Triton",
    "pallas": "Pallas",
    "torch": "torch",
}
VENDOR_TIER = "vendor library"
FALLBACK_TIER = "reference fallback"
ABSENT_TIER = "absent"

# Which ops read or write each family of formats (the format section asks them).
FORMAT_FAMILIES: dict[str, tuple[str, ...]] = {
    "latent": ("kv.write_latent", "sparse_mla.decode", "sparse_mla.prefill"),
    "index_keys": ("kv.write_index_keys", "indexer.logits_paged", "indexer.logits_ragged"),
    "moe_weights": ("moe.experts",),
}


def format_names() -> dict[str, list[str]]:
    """Every format of each family, from the format modules themselves."""
    from hwrun.kv.specs import index_key_format_names, latent_format_names
    from hwrun.ops.quantized_weight import WEIGHT_FORMATS

    return {
        "latent": latent_format_names(),
        "index_keys": index_key_format_names(),
        "moe_weights": list(WEIGHT_FORMATS),
    }


def platform_rows(plugin_set: PluginSet, names: list[str]) -> list[dict[str, Any]]:
    """Every discovered plugin (loaded or not) with its Target and claims; ``names`` are the
    loaded platforms the report covers."""
    rows = []
    for plugin in plugin_set.plugins:
        if plugin.status == "loaded" and plugin.name not in names:
            continue
        row: dict[str, Any] = {
            "name": plugin.name,
            "vendor": plugin.info.vendor if plugin.info else None,
            "description": plugin.info.description if plugin.info else None,
            "version": plugin.version,
            "api_version": plugin.api_version,
            "status": plugin.status,
            "reason": plugin.reason,
            "module": plugin.module,
            "target": None,
            "device_type": None,
            "devices": [],
            "device_reasons": [],
            "claims": None,
        }
        if plugin.status == "loaded":
            target = plugin_set.target(plugin.name)
            claims = plugin_set.capabilities(plugin.name)
            row.update(
                target=target.describe(),
                device_type=target.device_type,
                devices=[asdict(d) for d in target.devices],
                device_reasons=list(target.reasons),
                claims={
                    "ops": sorted(claims.ops),
                    "formats": sorted(claims.formats),
                    "dtypes": sorted(claims.dtypes),
                    "features": sorted(claims.features),
                    "notes": list(claims.notes),
                    "hardware_validated": [list(t) for t in claims.hardware_validated],
                },
            )
        rows.append(row)
    return rows


def op_matrix(
    plugin_set: PluginSet, names: list[str], sources: list[ResultSource]
) -> list[dict[str, Any]]:
    """One row per catalogue op: per platform, which impl serves its default spec here, of
    which tier, claimed or not, validated on hardware or not, and its conformance counts."""
    from hwrun.ops import catalogue

    rows = []
    for contract in catalogue().values():
        cells = {}
        for name in names:
            target = plugin_set.target(name)
            spec = target.place(contract.default_spec)
            cells[name] = _op_cell(plugin_set, name, target, spec, sources)
        rows.append({"op": contract.name, "summary": contract.summary, "platforms": cells})
    return rows


def _op_cell(
    plugin_set: PluginSet,
    platform: str,
    target: Target,
    spec: OpSpec,
    sources: list[ResultSource],
) -> dict[str, Any]:
    registry = plugin_set.registry(platform)
    claims = plugin_set.capabilities(platform)
    impls = registry.impls(spec.op)
    validated = {(op, impl): arch for op, impl, arch in claims.hardware_validated}
    cell: dict[str, Any] = {
        "impl": None,
        "tier": ABSENT_TIER,
        "fallback": False,
        "claimed": spec.op in claims.ops,
        "impls": [
            {
                "name": impl.name,
                "tier": tier_of(impl.name),
                "priority": impl.priority,
                "validated_on_hardware": validated.get((spec.op, impl.name)),
            }
            for impl in impls
        ],
        "rejected": {},
        "hardware": None,
        "conformance": [],
        "state": "untested",
    }
    try:
        selection = registry.select(spec, allow_fallback=True)
    except UnsupportedError as err:
        cell["rejected"] = err.reasons
    else:
        impl = selection.impl
        cell.update(
            impl=impl.name if not selection.fallback else f"{impl.platform}:{impl.name}",
            tier=FALLBACK_TIER if selection.fallback else tier_of(impl.name),
            fallback=selection.fallback,
            rejected=selection.rejected,
        )
    cell["hardware"] = _hardware(platform, spec.op, impls, validated)
    for source in sources:
        counts = source.counts(platform, spec.op)
        if counts:
            cell["conformance"].append(
                {"source": source.name, "device": source.where(platform), "counts": counts}
            )
    cell["state"] = state_of(_merged(c["counts"] for c in cell["conformance"]))
    return cell


def _hardware(platform: str, op: str, impls: list, validated: dict) -> str | None:
    """What the plugin says about its own impls of ``op`` on hardware (None for the reference,
    which runs on the host by definition, and when the platform has no impl of it)."""
    if platform == "reference" or not impls:
        return None
    said = [f"{i.name} on {validated[(op, i.name)]}" for i in impls if (op, i.name) in validated]
    if not said:
        return "not validated on hardware"
    unvalidated = [i.name for i in impls if (op, i.name) not in validated]
    text = "validated: " + ", ".join(said)
    if unvalidated:
        text += f"; not validated on hardware: {', '.join(unvalidated)}"
    return text


def format_matrix(
    plugin_set: PluginSet, names: list[str], sources: list[ResultSource]
) -> list[dict[str, Any]]:
    """One row per (family, format): per platform, which of the family's ops its own impls
    serve in that format here, whether the platform claims it, and conformance counts of the
    cases that use it."""
    from hwrun.ops import catalogue

    contracts = catalogue()
    rows = []
    for family, formats in format_names().items():
        for fmt in formats:
            cells = {}
            for name in names:
                target = plugin_set.target(name)
                registry = plugin_set.registry(name)
                own, fallback = [], []
                for op in FORMAT_FAMILIES[family]:
                    spec = dataclasses.replace(
                        target.place(contracts[op].default_spec), formats=(fmt,)
                    )
                    try:
                        selection = registry.select(spec, allow_fallback=True)
                    except UnsupportedError:
                        continue
                    (fallback if selection.fallback else own).append(op)
                counts = _merged(
                    _format_counts(source, name, fmt, FORMAT_FAMILIES[family]) for source in sources
                )
                cells[name] = {
                    "served_by_own_impls": own,
                    "reference_fallback": fallback,
                    "claimed": fmt in plugin_set.capabilities(name).formats,
                    "conformance": counts,
                    "state": state_of(counts),
                }
            rows.append({"family": family, "format": fmt, "platforms": cells})
    return rows


def _format_counts(
    source: ResultSource, platform: str, fmt: str, ops: tuple[str, ...]
) -> dict[str, int]:
    found: dict[str, int] = {}
    for row in source.rows:
        if (
            row["platform"] == platform
            and row["op"] in ops
            and row["op"] != AUDIT_OP
            and fmt in (row.get("formats") or ())
        ):
            found[row["status"]] = found.get(row["status"], 0) + 1
    return found


def _merged(all_counts: Any) -> dict[str, int]:
    from hwrun.report.results import SEVERITY

    total: dict[str, int] = {}
    for counts in all_counts:
        for status, n in counts.items():
            total[status] = total.get(status, 0) + n
    return {s: total[s] for s in SEVERITY if s in total}


def tier_of(impl_name: str) -> str:
    return TIERS.get(impl_name, VENDOR_TIER)


def serves_summary(platform_row: dict[str, Any], ops: list[dict[str, Any]]) -> str:
    """One sentence: what the platform serves here with its own impls, or that it serves
    nothing, and why (its devices' reasons)."""
    name = platform_row["name"]
    if platform_row["status"] != "loaded":
        return f"{name} is {platform_row['status']}: {platform_row['reason']}"
    own = [
        row["op"]
        for row in ops
        if row["platforms"][name]["impl"] is not None and not row["platforms"][name]["fallback"]
    ]
    if name == "reference":
        return f"reference serves {len(own)} of {len(ops)} ops on the host CPU"
    if not own:
        return (
            f"{name} serves no op on this host with its own impls; every op it is asked for "
            "falls back to the reference"
        )
    return (
        f"{name} serves {len(own)} of {len(ops)} ops with its own impls on {platform_row['target']}"
    )
