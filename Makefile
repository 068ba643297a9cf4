# The two commands of README.md. Everything lives in .venv; torch is pinned to the CPU build
# on this machine's disk first, so nothing pulls a multi-GB CUDA wheel.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup fms-venv demo lint test test-servers test-fast test-loaded bench fuzz soak clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[train,aim,mlflow,tensorboard,wandb,clearml,nats,test,bench,plot,prometheus]'
	touch $(STAMP)

setup: $(STAMP)

# The compatibility tier (docs/development.md): fms-hf-tuning 3.2.2 with its own pins, beside the same CPU
# torch, and this checkout with the [hf] extra alone: what a user of fms-hf-tuning installs. fms itself goes in
# with --no-deps (it pins torch<2.9, a CUDA build of several GB); its other requirements are installed by hand,
# at its pins, and every package at constraints-fms.txt's version. Built once, like .venv.
FMS_VENV := .venv-fms
FMS_PY := $(FMS_VENV)/bin/python
FMS_STAMP := $(FMS_VENV)/.installed
FMS_PINS := "transformers==4.55.4" "trl==0.19.1" "peft==0.19.1" "accelerate>=1.9,<2" "datasets>=4,<5" \
	"tokenizers<=0.22" "numpy<2.2" "sentencepiece<0.3" "simpleeval>=0.9.13,<2" "tqdm<5" "pillow>=12.3" "kernels<=0.9"

$(FMS_STAMP): pyproject.toml constraints-fms.txt
	$(PYTHON) -m venv $(FMS_VENV)
	$(FMS_PY) -m pip install -q --upgrade pip
	$(FMS_PY) -m pip install -q torch==2.13.0
	$(FMS_PY) -m pip install -q --no-deps fms-hf-tuning==3.2.2
	$(FMS_PY) -m pip install -q -c constraints-fms.txt $(FMS_PINS)
	$(FMS_PY) -m pip install -q -c constraints-fms.txt -e '.[hf]' "pytest>=8" "pytest-timeout>=2.3" "psutil>=5.9"
	$(FMS_PY) -m pip check 2>&1 | grep -v -e '^fms-hf-tuning 3.2.2 .*torch' -e '^No broken requirements' \
	  | { ! grep .; } || { echo "the compatibility venv's pins do not hold (pip check above)"; exit 1; }
	touch $(FMS_STAMP)

fms-venv: $(FMS_STAMP)

demo: $(STAMP)
	$(PY) -m trainer --demo --output_dir demo-output

# Tests run in pytest-xdist worker processes (docs/development.md): the fast tier mostly waits on the
# relay and publisher processes it starts, so TEST_WORKERS (4) overlap those waits; the whole suite
# runs in SUITE_WORKERS (2), since its slow tier is CPU-bound torchrun and benchmark jobs with their
# own time limits, and four at once on two cores ran past them.
TEST_WORKERS ?= 4
SUITE_WORKERS ?= 2

# The checkout's own bytecode is cached like any installed package's: where PYTHONDONTWRITEBYTECODE is set,
# every relay, publisher, sink and trainer process the suite starts compiled relay/, sinks/ and trainer/
# again, and every pytest worker rewrote every test module's asserts (docs/development.md, "Where the time goes").
test test-fast test-loaded: export PYTHONDONTWRITEBYTECODE =

# Both print what each tier cost in CPU and wall seconds, the load, and the costliest tests
# (tests/budget.py); `make test` fails on a skip that is not on tests/skip_policy.py's allow-list.
test: $(STAMP) $(FMS_STAMP) lint test-servers
	$(PY) -m pytest -q -n $(SUITE_WORKERS) --budget=20 --strict-skips

# ruff (pyflakes and pycodestyle's errors, and the style sets pyproject.toml selects) on everything,
# mypy on relay/, sinks/, trainer/ (pyproject.toml says how strict): part of `make test`, first:
# about 70 s of CPU from a clean clone (mypy reads the typed libraries once; its .mypy_cache makes a
# rerun seconds), while the suite takes many minutes.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# tests/test_prometheus_torchrun.py runs Debian's Prometheus and Alertmanager: installed when missing, as
# root (CI runs as root); elsewhere the test says why it skips.
test-servers:
	@if ! command -v prometheus >/dev/null || ! command -v prometheus-alertmanager >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus prometheus-alertmanager >/dev/null; \
	  else echo "prometheus/prometheus-alertmanager missing and not root: their test will skip"; fi; \
	fi

# The edit-test loop: everything but torchrun training jobs, benchmark and soak smoke runs (docs/development.md).
test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow" --budget=10

# The whole suite beside BURN_PROCS busy loops (load >= 6): what must pass on a busy machine.
BURN_PROCS ?= 6
test-loaded: $(STAMP)
	$(PY) tests/burn.py --procs $(BURN_PROCS) -- $(MAKE) --no-print-directory test

bench: $(STAMP)
	$(PY) -m bench

FUZZ_SECONDS ?= 600
fuzz: $(STAMP)
	$(PY) -m tests.fuzz --seconds $(FUZZ_SECONDS)

# An hour of ranks, a hostile client and relay restarts, and beside it CRASH_KILLS SIGKILLs of a relay
# under large events (bench/crash.py); figures in docs/reliability.md (not CI).
SOAK_SECONDS ?= 3600
CRASH_KILLS ?= 2000
soak: $(STAMP)
	$(PY) -m bench.soak --seconds $(SOAK_SECONDS) --crash-kills $(CRASH_KILLS) --report docs/reliability.md

clean:
	rm -rf $(VENV) $(FMS_VENV) demo-output
