"""Every workbook notebook executes under papermill on the embedded default (tiny Qwen3 on vLLM's CPU build)
with small parameters, and its runs are found in DuckDB with the executed notebook's path. At most one or two
servers are launched per notebook; skipped trials cost nothing.

The notebooks run in two streams at once, each a papermill process per notebook in turn with its own DuckDB
file: a vLLM CPU server's start is ~50 s of one core (three Python processes importing torch, one after the
other), and one stream at a time left the other core idle for most of this module's half hour. The second
stream's kernels are held to the first core, so its servers start there (unpinned: one core) while the first
stream's servers start on the others (engine.cpu_server_pin)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
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
# Two streams of about the same number of server starts; the report reads the first stream's file after it.
STREAMS = {
    "a": ["10_baseline", "20_quantization", "30_block_size", "40_scheduler", "50_prefix_cache",
          "60_attention_and_builds", "70_numa", "99_report"],
    "b": ["00_environment", "80_long_context", "82_routing", "85_thinking_mode", "90_soak"],
}
STREAM_OF = {stem: name for name, stems in STREAMS.items() for stem in stems}
TIMINGS: dict[str, float] = {}
# the first test waits for every notebook (~15 min); each papermill process has 900 s
pytestmark = pytest.mark.timeout(2700)


def kernel_env() -> dict[str, str]:
    # The kernel is another process: it must import this checkout's qwen3lab, not whatever is installed.
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path}


def paths(stem: str, workdir: Path) -> tuple[Path, Path, Path]:
    """(executed notebook, DuckDB file, runs folder) of a notebook's stream."""
    stream = STREAM_OF[stem]
    return workdir / f"{stem}.out.ipynb", workdir / f"workbook-{stream}.duckdb", workdir / f"runs-{stream}"


def execute(stem: str, workdir: Path, params: dict, cpus: set[int] | None = None) -> tuple[nbformat.NotebookNode, Path]:
    """papermill in a process of its own (held to `cpus`: its kernel and the servers it starts inherit them)."""
    out, db, runs_dir = paths(stem, workdir)
    chapter = workbook.NOTEBOOKS[stem]
    parameters = {"experiment": EXPERIMENT, **params}
    if stem != "00_environment":
        parameters["db"] = str(db)
    if chapter:
        parameters |= {"chapter": chapter, "runs_dir": str(runs_dir), "notebook_path": str(out)}
    params_file = workdir / f"{stem}.params.json"
    params_file.write_text(json.dumps(parameters))
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", str(ROOT / "notebooks" / f"{stem}.ipynb"), str(out),
         "-f", str(params_file), "-k", "python3", "--cwd", str(ROOT), "--no-progress-bar"],
        env=kernel_env(), capture_output=True, text=True, timeout=900,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    TIMINGS.setdefault(stem, time.monotonic() - t0)  # the first execution (a resume re-run is not timed)
    assert proc.returncode == 0, f"papermill {stem}: rc {proc.returncode}\n{proc.stderr[-4000:]}"
    return nbformat.read(out, as_version=4), out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("workbook")


@pytest.fixture(scope="module")
def executed(workdir) -> dict[str, tuple]:
    """Every notebook executed once, two streams at a time: stem -> (notebook, path) or the exception."""
    cpus = sorted(os.sched_getaffinity(0))
    held = {"a": None, "b": {cpus[0]} if len(cpus) >= 2 else None}
    results: dict[str, tuple] = {}

    def stream(name: str) -> None:
        for stem in STREAMS[name]:
            try:
                results[stem] = execute(stem, workdir, CASES[stem][0], held[name])
            except BaseException as exc:  # noqa: BLE001 - reported by that notebook's test
                results[stem] = (exc,)

    with ThreadPoolExecutor(len(STREAMS)) as pool:
        list(pool.map(stream, STREAMS))
    return results


def outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            parts.append(o.get("text", "") if o.get("output_type") == "stream" else str(o.get("data", {})))
    return "\n".join(parts)


def test_every_notebook_has_a_stream():
    assert sorted(STREAM_OF) == sorted(CASES) and len(STREAM_OF) == sum(map(len, STREAMS.values()))


@pytest.mark.parametrize("stem", list(CASES))
def test_notebook_executes_and_stores_its_runs(stem, workdir, executed):
    params, must_run = CASES[stem]
    if len(executed[stem]) == 1:
        raise executed[stem][0]
    nb, out = executed[stem]
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
    _, db, _ = paths(stem, workdir)
    runs = Store(db).runs(chapter=chapter)
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


def test_a_second_execution_resumes(workdir, executed):
    """Executing a notebook again runs nothing that is already measured."""
    _, db, _ = paths("10_baseline", workdir)
    runs_before = Store(db).runs(chapter="baseline")
    assert not runs_before.empty, "the baseline notebook stored no run"
    nb, _ = execute("10_baseline", workdir, SMALL)
    assert "not run again" in outputs_text(nb)
    runs_after = Store(db).runs(chapter="baseline")
    assert len(runs_after) == len(runs_before)


def test_report_timings(executed):
    """Not a check: prints how long each notebook took (pytest -s shows it)."""
    for stem, seconds in TIMINGS.items():
        print(f"{stem:28s} {STREAM_OF[stem]} {seconds:6.1f} s")
    print(f"{'total (sum of both streams)':28s}   {sum(TIMINGS.values()):6.1f} s")
