"""report.json's data: what a platform serves here, claims against results, hardware notes,
capacity from the planner, benchmark files."""

import json

import pytest
from conftest import RESULTS, write_plugin

from hwrun.errors import UsageError
from hwrun.kv.capacity import plan_capacity
from hwrun.kv.layout import plan_packed_layout
from hwrun.models import get_model
from hwrun.ops import catalogue
from hwrun.plugins import load_plugins
from hwrun.report import build_report, load_source, load_sources
from hwrun.report.bench import load_bench
from hwrun.report.capacity import capacity_section
from hwrun.report.render import render_html, render_markdown


def _report(plugin_set, names, sources=(), bench=(), models=()):
    return build_report(plugin_set, list(names), list(sources), list(bench), list(models), 10**11)


def test_a_platform_that_serves_nothing_here_says_so(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    module = write_plugin(tmp_path, "hwrun_report_empty")
    plugin_set = load_plugins([module])
    report = _report(plugin_set, ["reference", module])
    (row,) = [p for p in report["platforms"] if p["name"] == module]
    assert row["status"] == "loaded" and row["target"] == "cpu"
    assert row["serves"] == (
        f"{module} serves no op on this host with its own impls; every op it is asked for "
        "falls back to the reference"
    )
    assert row["device_reasons"] == ["no test accelerator on this host"]
    assert len(report["ops"]) == len(catalogue())
    for op in report["ops"]:
        cell = op["platforms"][module]
        assert cell["tier"] == "reference fallback" and cell["fallback"], op["op"]
        assert cell["impls"] == [] and not cell["claimed"] and cell["hardware"] is None
        assert "the hwrun_report_empty platform does not implement it" in str(cell["rejected"])
    reference = next(p for p in report["platforms"] if p["name"] == "reference")
    assert (
        reference["serves"]
        == f"reference serves {len(catalogue())} of {len(catalogue())} ops on the host CPU"
    )


def _results(tmp_path, rows, run=None, name="machine"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if run is not None:
        (folder / "run.json").write_text(json.dumps(run))
    return str(folder / "results.jsonl")


def _row(platform, op, case, status, impl="reference", formats=()):
    return {
        "platform": platform,
        "op": op,
        "case": case,
        "status": status,
        "impl": impl,
        "formats": list(formats),
    }


def test_a_claimed_op_that_fails_is_shown_failing(tmp_path):
    path = _results(
        tmp_path,
        [
            _row("reference", "indexer.topk", "ties", "FAIL"),
            _row("reference", "indexer.topk", "short", "PASS"),
            _row("reference", "kv.write_index_keys", "fp8", "PASS", formats=("fp8",)),
            _row("reference", "kv.write_index_keys", "mxfp4", "CRASH", formats=("mxfp4",)),
        ],
        {"date": "2026-12-01T00:00:00+00:00", "commit": "abc", "devices": {}},
    )
    report = _report(load_plugins([]), ["reference"], load_sources([path]))
    ops = {row["op"]: row["platforms"]["reference"] for row in report["ops"]}
    topk = ops["indexer.topk"]
    assert topk["claimed"] and topk["impl"] == "reference"
    assert topk["state"] == "failing"
    assert topk["conformance"] == [
        {"source": "machine", "device": "cpu", "counts": {"FAIL": 1, "PASS": 1}}
    ]
    assert ops["attn.lse_combine"]["state"] == "untested"
    formats = {(f["family"], f["format"]): f["platforms"]["reference"] for f in report["formats"]}
    assert formats[("index_keys", "mxfp4")]["state"] == "failing"
    assert formats[("index_keys", "fp8")]["state"] == "pass"
    markdown = render_markdown(report)
    (line,) = [x for x in markdown.splitlines() if x.startswith("| `indexer.topk`")]
    assert "machine: FAIL 1 · PASS 1" in line and "**FAILING**" in line
    assert '<td class="failing">reference; claimed; machine: FAIL 1' in render_html(report)


def _with_nvidia_adapters(monkeypatch):
    """Register the DeepGEMM and FlashMLA adapters as on a machine with their wheels (the
    libraries are imported only when an impl runs)."""
    monkeypatch.setattr("hwrun_nvidia.deepgemm.importable", lambda name: True)
    monkeypatch.setattr("hwrun_nvidia.deepgemm_linear.importable", lambda name: True)
    monkeypatch.setattr("hwrun_nvidia.flashmla.importable", lambda name: True)


def test_impls_the_plugin_has_not_run_on_hardware_say_so(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _with_nvidia_adapters(monkeypatch)
    plugin_set = load_plugins([])
    report = _report(plugin_set, ["nvidia", "amd"])
    ops = {row["op"]: row["platforms"] for row in report["ops"]}
    # The NVIDIA plugin names its H200-validated impls, each with the architecture it ran on
    # (DeepGEMM and Gluon refuse CPU tensors here).
    assert ops["indexer.logits_paged"]["nvidia"]["hardware"] == (
        "validated: deepgemm on sm_90, gluon on sm_90, triton on sm_90"
    )
    assert ops["indexer.logits_paged"]["nvidia"]["tier"] == "portable Triton"
    # AMD's Triton tier has never run on an AMD GPU: every one of its impls says so.
    assert ops["indexer.logits_paged"]["amd"]["hardware"] == "not validated on hardware"
    assert ops["kda.step"]["amd"]["hardware"] is None  # no impl of its own to speak of


def test_every_hardware_validated_impl_is_registered(monkeypatch):
    _with_nvidia_adapters(monkeypatch)
    plugin_set = load_plugins([])
    for name in plugin_set.names():
        registry = plugin_set.registry(name)
        for op, impl, _arch in plugin_set.capabilities(name).hardware_validated:
            assert impl in [i.name for i in registry.impls(op)], (name, op, impl)


def test_malformed_hardware_validated_makes_the_plugin_broken(tmp_path, monkeypatch):
    claims = """
        from hwrun.platform import Capabilities

        @hookimpl
        def hwrun_capabilities(target):
            return Capabilities(hardware_validated=(("indexer.topk", "triton"),))
        """
    monkeypatch.syspath_prepend(str(tmp_path))
    module = write_plugin(tmp_path, "hwrun_report_bad_claims", claims)
    (plugin,) = [p for p in load_plugins([module]).plugins if p.name == module]
    assert plugin.status == "broken"
    assert "hardware_validated" in plugin.reason and "(op, impl, arch)" in plugin.reason


def test_results_keep_the_device_of_their_run():
    h200 = load_source(RESULTS / "nvidia-h200" / "results.jsonl")
    assert h200.device("nvidia").startswith("cuda: 1 x NVIDIA H200")
    assert h200.on_hardware("nvidia")
    interpreted = load_source(RESULTS / "nvidia-interpreter" / "results.jsonl")
    assert interpreted.where("nvidia") == "cpu (Triton interpreter)"
    assert not interpreted.on_hardware("nvidia")


def test_results_without_run_json_have_an_unknown_device(tmp_path):
    source = load_source(_results(tmp_path, [_row("nvidia", "indexer.topk", "a", "PASS")]))
    assert source.device("nvidia") == "unknown (no run.json beside the results)"
    assert not source.on_hardware("nvidia")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json\n", "results.jsonl:1: not JSON"),
        ('{"platform": "x"}\n', "results.jsonl:1: not a conformance row (missing op, case, status"),
        (
            '{"platform": "x", "op": "o", "case": "c", "status": "MAYBE"}\n',
            "unknown status 'MAYBE'",
        ),
    ],
)
def test_malformed_results_are_usage_errors(tmp_path, content, message):
    path = tmp_path / "results.jsonl"
    path.write_text(content)
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        load_source(path)


def test_capacity_is_the_planners():
    model = get_model("kimi-k3.1-pro")
    budget = 100 * 10**9
    section = capacity_section(model, budget)
    pool = {(r["gpus"], r["mode"]): r for r in section["pool"]}
    assert set(pool) == {
        (1, "TP"),
        (2, "TP"),
        (2, "DCP"),
        (4, "TP"),
        (4, "DCP"),
        (8, "TP"),
        (8, "DCP"),
    }
    layout = plan_packed_layout(model, 8, 8)
    assert (
        pool[(8, "DCP")]["tokens_per_replica"] == plan_capacity(layout, budget).tokens_per_cluster
    )
    assert (
        pool[(8, "DCP")]["concurrent_1M"]
        == plan_capacity(layout, budget, 2**20).concurrent_requests
    )
    # DCP shards the latent and index keys by token: eight GPUs hold eight times the tokens.
    assert pool[(8, "DCP")]["tokens_per_replica"] == 8 * pool[(8, "TP")]["tokens_per_replica"]
    fp8 = next(
        r
        for r in section["bytes_per_token"]
        if (r["latent_format"], r["index_format"]) == ("fp8_ds_mla", "fp8")
    )
    # docs/capacity.md: K3.1 Pro stores 656 B of latent and 132 B of index keys per layer.
    assert fp8["latent"] == 656 * section["bytes_per_token"][0]["latent"] // 1152
    assert fp8["total"] == fp8["latent"] + fp8["index_keys"]


def test_bench_files_with_and_without_their_card(tmp_path):
    envelope = load_bench(RESULTS / "nvidia-h200" / "bench" / "moe_gpu.json")
    assert envelope["card"].startswith("NVIDIA H200") and envelope["commit"] == "500257b"
    first = envelope["rows"][0]
    assert first["vs_peer"]["DeepGEMM GEMMs"] == pytest.approx(
        first["us"] / first["peers"]["DeepGEMM GEMMs"]
    )
    assert first["percent_of_roofline"] == pytest.approx(100 * first["floor_us"] / first["us"])
    bare = tmp_path / "decode.json"
    bare.write_text(
        json.dumps(
            [
                {
                    "batch": 8,
                    "context": 32768,
                    "topk": 2048,
                    "tpot_ms": 10.0,
                    "roofline_ms": 2.5,
                    "tokens_per_s": 800.0,
                }
            ]
        )
    )
    loaded = load_bench(str(bare))
    assert (loaded["card"], loaded["date"], loaded["commit"]) == ("not recorded",) * 3
    (row,) = loaded["rows"]
    assert (row["op"], row["us"], row["percent_of_roofline"]) == (
        "engine.decode_step",
        10000.0,
        25.0,
    )
    (tmp_path / "bad.json").write_text('{"rows": []}')
    with pytest.raises(UsageError, match="not a bench file"):
        load_bench(str(tmp_path / "bad.json"))


def test_what_the_bench_scripts_write_the_report_reads_with_card_date_and_commit(tmp_path):
    from hwrun.provenance import source_commit
    from hwrun.report.bench import bench_file

    row = {"op": "indexer.topk", "shape": "1x131072 k=2048", "impl": "triton", "us": 26.5,
           "floor_us": 0.1, "peers": {"torch.topk": 69.1}, "note": ""}  # fmt: skip
    path = tmp_path / "bench.json"
    path.write_text(bench_file("gpu_ops", "NVIDIA H200, copy 4.22 TB/s", [row]))
    loaded = load_bench(str(path))
    assert loaded["card"] == "NVIDIA H200, copy 4.22 TB/s" and loaded["bench"] == "gpu_ops"
    assert loaded["commit"] == (source_commit() or "not recorded")
    assert len(loaded["date"]) == 10  # an ISO date
    assert loaded["rows"][0]["vs_peer"] == {"torch.topk": pytest.approx(26.5 / 69.1)}
