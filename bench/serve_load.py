"""Load benchmark of `hwrun serve`: N concurrent streaming requests on loopback.

Starts `hwrun serve` (the embedded default model unless --model) on a free loopback port, reads
the KV pool usage from /metrics, then sends N streaming completions at once (each with its own
prompt and seed, ``ignore_eos`` so each generates exactly --max-tokens tokens) and checks that
every one completes: one response id per request, no id seen twice, every stream ending in
``data: [DONE]`` with finish_reason "length" and the asked number of tokens, and the KV usage back
at its baseline afterwards. Prints throughput and p50 / p99 latencies (time to first token,
end to end) as a Markdown table row for docs/benchmarks.md. Bounded: every request has a
timeout, and the server is stopped (SIGTERM) at the end.

    .venv/bin/python bench/serve_load.py [--requests 500] [--max-tokens 16] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "hex",
    "a",
    "jolly",
]


@dataclass
class Result:
    index: int
    ids: set[str] = field(default_factory=set)
    tokens: int = 0
    finish_reason: str | None = None
    done: bool = False
    error: str | None = None
    ttft: float | None = None
    e2e: float | None = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def prompt(index: int, length: int) -> str:
    return " ".join(WORDS[(index * 7 + k) % len(WORDS)] for k in range(length))


async def one_request(
    client: httpx.AsyncClient, index: int, args: argparse.Namespace, model: str
) -> Result:
    result = Result(index)
    body = {
        "model": model,
        "prompt": prompt(index, args.prompt_words),
        "max_tokens": args.max_tokens,
        "temperature": 1.0,
        "seed": index,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    start = time.monotonic()
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    result.done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    break
                result.ids.add(chunk["id"])
                for choice in chunk["choices"]:
                    new = len(choice.get("token_ids") or [])
                    if new and result.ttft is None:
                        result.ttft = time.monotonic() - start
                    result.tokens += new
                    result.finish_reason = choice["finish_reason"] or result.finish_reason
    except (TimeoutError, httpx.HTTPError) as err:
        result.error = f"{type(err).__name__}: {err}"
    result.e2e = time.monotonic() - start
    return result


async def run_load(url: str, args: argparse.Namespace, model: str) -> tuple[list[Result], float]:
    limits = httpx.Limits(max_connections=args.requests + 10, max_keepalive_connections=0)
    timeout = httpx.Timeout(args.timeout, connect=60)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        start = time.monotonic()
        results = await asyncio.gather(
            *(one_request(client, i, args, model) for i in range(args.requests))
        )
        return list(results), time.monotonic() - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--prompt-words", type=int, default=12)
    parser.add_argument("--model", default=None, help="checkpoint directory (default: embedded)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-c", "from hwrun.cli import main; main()", "serve"]
    command += ["--port", str(port), "--log-level", "warning"]
    command += ["--max-num-seqs", str(args.max_num_seqs), "--max-queued", str(args.requests)]
    if args.model:
        command += ["--model", args.model]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if http.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    print(server.stderr.read(), file=sys.stderr)
                    return 1
                time.sleep(0.5)
            model = http.get("/v1/models").json()["data"][0]["id"]
            baseline = metric(http, "hwrun_kv_blocks_used")
            results, wall = asyncio.run(run_load(url, args, model))
            deadline = time.monotonic() + 60
            while metric(http, "hwrun_num_requests_running") and time.monotonic() < deadline:
                time.sleep(0.2)
            after = metric(http, "hwrun_kv_blocks_used")
            total_blocks = metric(http, "hwrun_kv_blocks_total")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()

    failed = [r for r in results if r.error or not r.done]
    all_ids = [i for r in results for i in r.ids]
    duplicated = len(all_ids) - len(set(all_ids))
    one_id_each = all(len(r.ids) == 1 for r in results if not r.error)
    wrong = [
        r
        for r in results
        if not r.error and (r.tokens != args.max_tokens or r.finish_reason != "length")
    ]
    ok = [r for r in results if not r.error and r.done]
    tokens = sum(r.tokens for r in ok)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2es = [r.e2e for r in ok]
    print(
        f"requests {args.requests}, prompt {args.prompt_words} words, {args.max_tokens} tokens "
        f"each, max_num_seqs {args.max_num_seqs}, model {model}, {os.cpu_count()} CPUs"
    )
    print(
        f"completed {len(ok)}/{args.requests}, failed {len(failed)}, wrong length {len(wrong)}, "
        f"duplicate ids {duplicated}, one id per stream {one_id_each}"
    )
    print(f"KV blocks used: {baseline:.0f} before, {after:.0f} after (of {total_blocks:.0f})")
    if ok:
        print("| requests | completed | wall s | output tok/s | req/s | TTFT p50 s | TTFT p99 s "
              "| e2e p50 s | e2e p99 s | KV blocks before / after |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|")
        ttft = f"{statistics.median(ttfts):.2f} | {percentile(ttfts, 0.99):.2f}"
        e2e = f"{statistics.median(e2es):.2f} | {percentile(e2es, 0.99):.2f}"
        print(
            f"| {args.requests} | {len(ok)} | {wall:.1f} | {tokens / wall:.1f} | "
            f"{len(ok) / wall:.2f} | {ttft} | {e2e} | {baseline:.0f} / {after:.0f} |"
        )
    for r in failed[:5]:
        print(f"request {r.index}: {r.error or 'stream ended without [DONE]'}", file=sys.stderr)
    good = not failed and not wrong and not duplicated and one_id_each and after == baseline
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
