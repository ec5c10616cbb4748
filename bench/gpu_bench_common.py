"""Shared pieces of the GPU benchmarks: timing, measured ceilings, input builders, table rows.

Times are medians of CUDA-graph replays (``triton.testing.do_bench_cudagraph``): serving
replays graphs, and without one a small op measures the host's launch overhead instead (the
same batch-1 kernels read 13 us on one machine and 70-80 us on the next with plain launches).
What cannot be captured (the torch references synchronize) falls back to ``do_bench``
(CUDA events, L2 flushed before every run).
Ceilings are measured in the same process: a device-to-device copy (bytes read + written per
second), a large bf16 matrix product and, on Hopper, the same product in fp8 (FLOP/s);
"% roof" is the time the op's unavoidable bytes (or FLOPs of its product type, when larger)
would take at those rates over the measured time.
"""

from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass, field

import torch
import triton
from kernel_timeline import timeline

from hwrun.formats.index_keys import get_index_key_format
from hwrun.formats.latent import get_latent_format
from hwrun.report.bench import bench_file


def bench(fn, warmup: int = 25, rep: int = 100, graph: bool = True) -> float:
    """Median time of ``fn()`` in microseconds, replayed in a CUDA graph where it captures."""
    if graph:
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3
        except Exception:  # not capturable (host synchronisation inside): plain launches
            torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3


def kernel_split(fn, calls: int = 50) -> tuple[float, dict[str, float]]:
    """Where one call of ``fn`` spends its device time, replayed in a CUDA graph under the
    torch profiler: (busy us per call, {kernel name: exposed us per call}, heaviest first).
    Exposed time is each kernel's time past the earlier kernels' ends (kernel_timeline.py), so
    a kernel launched early under programmatic dependent launch is charged its work, not its
    wait."""
    from torch.profiler import ProfilerActivity, profile

    fn()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            graph.replay()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    spans = timeline((e.name, e.time_range.start, e.time_range.end) for e in events)
    exposed = sorted(spans.exposed_us.items(), key=lambda item: -item[1])
    return spans.busy_us / calls, {name: us / calls for name, us in exposed}


def split_note(busy_us: float, exposed: dict[str, float]) -> str:
    """kernel_split's result as a row note: busy time, then each kernel's exposed us."""
    parts = ", ".join(f"{name.split('(')[0][:40]} {us:.1f}" for name, us in exposed.items())
    return f"device busy {busy_us:.1f} us: {parts}"


@dataclass
class Ceilings:
    copy_bytes_per_s: float
    bf16_flops_per_s: float
    fp8_flops_per_s: float = float("inf")  # unmeasured (no fp8 MMA): fp8 flops bound nothing

    def floor_us(self, nbytes: float, flops: float = 0.0, fp8_flops: float = 0.0) -> float:
        """The time the slowest of copy, bf16 products and fp8 products needs."""
        return (
            max(
                nbytes / self.copy_bytes_per_s,
                flops / self.bf16_flops_per_s,
                fp8_flops / self.fp8_flops_per_s,
            )
            * 1e6
        )


def copy_bytes_per_s(device: torch.device | str = "cuda") -> float:
    """The device-to-device copy rate, bytes read plus written per second: a 1 GiB copy timed
    by CUDA events (do_bench's median), so no host latency counts as copy time."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    return 2 * src.numel() / (bench(lambda: dst.copy_(src), graph=False) * 1e-6)


def measure_ceilings() -> Ceilings:
    copy = copy_bytes_per_s()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_us = bench(lambda: a @ b, graph=False)
    fp8_flops = float("inf")
    if torch.cuda.get_device_capability()[0] >= 9:  # fp8 tensor cores: Hopper on
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        mm8_us = bench(
            lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16), graph=False
        )
        fp8_flops = 2 * 8192**3 / (mm8_us * 1e-6)
    return Ceilings(copy, 2 * 8192**3 / (mm_us * 1e-6), fp8_flops)


@dataclass
class Row:
    op: str
    shape: str
    impl: str
    us: float
    floor_us: float
    peers: dict[str, float] = field(default_factory=dict)  # peer name -> us
    note: str = ""

    def cells(self) -> list[str]:
        ratios = ", ".join(f"{self.us / t:.2f}x {name}" for name, t in self.peers.items())
        peer_times = ", ".join(f"{name} {t:.1f}" for name, t in self.peers.items())
        roof = 100.0 * self.floor_us / self.us if self.us > 0 else float("nan")
        return [
            self.op,
            self.shape,
            self.impl,
            f"{self.us:.1f}",
            peer_times or "-",
            ratios or "-",
            f"{roof:.0f}%",
            self.note,
        ]


HEADER = ["op", "shape", "impl", "us", "peers (us)", "impl / peer", "% roof", "note"]


def markdown(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def index_cache(fmt: str, batch: int, ctx: int, block_size: int = 64, seed: int = 0):
    """A paged index-key cache holding ``batch`` requests of ``ctx`` random keys each, with the
    requests' blocks shuffled through the cache. Returns (cache, block_table)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    key_format = get_index_key_format(fmt)
    blocks_per_req = math.ceil(ctx / block_size)
    num_blocks = batch * blocks_per_req
    cache = torch.empty(
        num_blocks, block_size * key_format.bytes_per_token, dtype=torch.uint8, device="cuda"
    )
    chunk = 4096  # encode in chunks: the reference codec is not memory-lean
    for start in range(0, num_blocks, chunk):
        n = min(chunk, num_blocks - start)
        keys = torch.randn(n * block_size, 128, device="cuda", generator=g)
        elements, scales = key_format.encode(keys)
        cache[start : start + n, : block_size * key_format.element_bytes] = elements.reshape(n, -1)
        cache[start : start + n, block_size * key_format.element_bytes :] = scales.reshape(n, -1)
    perm = torch.randperm(num_blocks, device="cuda", generator=g).to(torch.int32)
    return cache, perm.reshape(batch, blocks_per_req)


def latent_cache(fmt: str, num_tokens: int, block_size: int = 64, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    latent = get_latent_format(fmt)
    rows = torch.empty(num_tokens, latent.row_bytes, dtype=torch.uint8, device="cuda")
    for start in range(0, num_tokens, 65536):
        n = min(65536, num_tokens - start)
        rows[start : start + n] = latent.encode(
            torch.randn(n, 512, device="cuda", generator=g),
            torch.randn(n, 64, device="cuda", generator=g),
        )
    return rows.reshape(num_tokens // block_size, block_size, latent.row_bytes)


def card_line(ceil: Ceilings) -> str:
    """The first line of every GPU table: the card, the ceilings measured in the run, torch."""
    name = torch.cuda.get_device_properties(0).name
    return (
        f"{name}, copy {ceil.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 matmul "
        f"{ceil.bf16_flops_per_s / 1e12:.0f} TFLOP/s, fp8 matmul "
        f"{ceil.fp8_flops_per_s / 1e12:.0f} TFLOP/s, torch {torch.__version__}"
    )


def start_run() -> tuple[Ceilings, str]:
    """A GPU bench's start: the seed, the card's ceilings measured now, and the card line
    (printed, and returned for the tables)."""
    torch.manual_seed(0)
    ceil = measure_ceilings()
    head = card_line(ceil)
    print(head, flush=True)
    return ceil, head


def write_results(
    out: str | None, stem: str, bench_name: str, head: str, rows: list[Row], log: list[str]
) -> None:
    """The run's log, card line and table printed; and ``stem``.md (the card line and the
    table), ``stem``.log and ``stem``.json (for ``hwrun report``) in the folder ``out``, when
    ``out`` is given."""
    print("\n".join(log) + "\n\n" + head + "\n\n" + markdown(rows))
    if not out:
        return
    folder = pathlib.Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.md").write_text(head + "\n\n" + markdown(rows) + "\n")
    (folder / f"{stem}.log").write_text("\n".join(log) + "\n")
    (folder / f"{stem}.json").write_text(bench_file(bench_name, head, [r.__dict__ for r in rows]))
