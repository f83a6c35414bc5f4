"""Every workbook notebook executes under papermill on the embedded default (tiny Qwen3 on vLLM's CPU build)
with small parameters, writing to one temporary DuckDB file, and its runs are found there with the executed
notebook's path. At most one or two servers are launched per notebook; skipped trials cost nothing."""
from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
import pytest

from qwen3lab.experiment import files as xp
from qwen3lab import workbook
from qwen3lab.store import Store

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = str(ROOT / "experiments" / "cpu-tiny.yaml")
SMALL = {"num_requests": 3, "warmup_requests": 0, "max_trials": 1}
# Per notebook: extra parameters, and whether at least one trial must end ok (i.e. a server really ran).
CASES = {
    "00_environment": ({}, False),
    "10_baseline": (SMALL, True),
    "20_quantization": (SMALL, True),
    "30_block_size": (SMALL, True),
    "40_scheduler": (SMALL, True),
    "50_prefix_cache": (SMALL | {"num_requests": 4}, True),
    "60_attention_and_builds": (SMALL, True),
    "70_numa": (SMALL, True),
    "80_long_context": (SMALL, True),
    "82_routing": (SMALL | {"num_requests": 6}, True),  # its first trial: two servers and the router
    "85_thinking_mode": (SMALL | {"max_trials": 2}, True),
    "90_soak": (SMALL | {"duration_s": 12, "window_s": 3}, True),
    "99_report": ({"n_boot": 200}, False),
}
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("workbook")


@pytest.fixture(autouse=True)
def kernel_imports_this_checkout(monkeypatch):
    # The kernel is another process: it must import this checkout's qwen3lab, not whatever is installed.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def execute(stem: str, workdir: Path, params: dict) -> tuple[nbformat.NotebookNode, Path]:
    import papermill as pm

    out = workdir / f"{stem}.out.ipynb"
    chapter = workbook.NOTEBOOKS[stem]
    parameters = {"experiment": EXPERIMENT, **params}
    if stem != "00_environment":
        parameters["db"] = str(workdir / "workbook.duckdb")
    if chapter:
        parameters |= {"chapter": chapter, "runs_dir": str(workdir / "runs"), "notebook_path": str(out)}
    t0 = time.monotonic()
    pm.execute_notebook(str(ROOT / "notebooks" / f"{stem}.ipynb"), str(out), parameters=parameters,
                        kernel_name="python3", cwd=str(ROOT), progress_bar=False)
    TIMINGS.setdefault(stem, time.monotonic() - t0)  # the first execution (a resume re-run is not timed)
    return nbformat.read(out, as_version=4), out


def outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            parts.append(o.get("text", "") if o.get("output_type") == "stream" else str(o.get("data", {})))
    return "\n".join(parts)


@pytest.mark.parametrize("stem", list(CASES))
def test_notebook_executes_and_stores_its_runs(stem, workdir):
    params, must_run = CASES[stem]
    nb, out = execute(stem, workdir, params)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    text = outputs_text(nb)
    chapter = workbook.NOTEBOOKS[stem]
    if stem == "00_environment":
        assert "No NVIDIA GPU here" in text or "GPU(s)" in text
        assert str(ROOT / "qwen3lab") in text, "the kernel imported another qwen3lab"
        return
    if stem == "99_report":
        # the earlier notebooks stored ok runs: each comparable group gets a winner line (or says why none)
        assert "Under the SLOs" in text and ("winner [" in text or "no winner [" in text), text[-2000:]
        assert "application/vnd.plotly.v1+json" in text
        return
    runs = Store(workdir / "workbook.duckdb").runs(chapter=chapter)
    mine = runs[runs.notebook_path == str(out)]
    assert not mine.empty, f"no run of chapter {chapter} has notebook_path {out}"
    assert set(mine.status) <= {"ok", "skipped"}, mine[["trial", "status", "reason"]].to_string()
    launched = mine[mine.status == "ok"]
    assert len(launched) <= params.get("max_trials", 1)
    if must_run:
        assert len(launched) >= 1
        assert "application/vnd.plotly.v1+json" in text  # the figures are in the saved notebook
    # Every trial of the chapter that cannot run here is stored as skipped, with its reason.
    trials = xp.expand(xp.load(EXPERIMENT), [chapter])
    skipped = mine[mine.status == "skipped"]
    assert skipped.reason.notna().all()
    assert len(mine) == len(launched) + len(skipped) <= len(trials)


def test_a_second_execution_resumes(workdir):
    """Executing a notebook again runs nothing that is already measured."""
    runs_before = Store(workdir / "workbook.duckdb").runs(chapter="baseline")
    if runs_before.empty:
        pytest.skip("runs after the baseline notebook test")
    nb, _ = execute("10_baseline", workdir, SMALL)
    assert "not run again" in outputs_text(nb)
    runs_after = Store(workdir / "workbook.duckdb").runs(chapter="baseline")
    assert len(runs_after) == len(runs_before)


def test_report_timings(workdir):
    """Not a check: prints how long each notebook took (pytest -s shows it)."""
    for stem, seconds in TIMINGS.items():
        print(f"{stem:28s} {seconds:6.1f} s")
    print(f"{'total':28s} {sum(TIMINGS.values()):6.1f} s")
