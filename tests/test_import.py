"""Importing real result files of vllm bench serve and GuideLLM (tests/data/import, made by
tools/make_import_fixtures.py against the tiny vLLM): rows, numbers that match the tools' own, idempotence,
and imported runs compare and win like qwen3lab's own."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qwen3lab.analysis import compare, importers
from qwen3lab.experiment.spec import SLO
from qwen3lab.store import Store

DATA = Path(__file__).parent / "data" / "import"
DETAILED = DATA / "vllm-bench-serve-detailed.json"
SUMMARY = DATA / "vllm-bench-serve.json"
GUIDELLM = DATA / "guidellm-benchmarks.json"


@pytest.fixture()
def store(tmp_path) -> Store:
    return Store(tmp_path / "import.duckdb")


def test_vllm_bench_detailed_rows_reproduce_its_numbers(store):
    (run_id,) = importers.import_files(store, [DETAILED])
    src = json.loads(DETAILED.read_text())
    run = store.run(run_id)
    assert run["engine_kind"] == "import" and run["chapter"] == "vllm-bench-serve" and run["status"] == "ok"
    prov = run["info"]["import"]
    assert prov["tool"] == "vllm-bench-serve" and prov["path"] == str(DETAILED.resolve()) and len(prov["sha256"]) == 64
    reqs = store.requests([run_id])
    assert len(reqs) == src["num_prompts"] == 40
    assert list(reqs.prompt_tokens) == src["input_lens"] and list(reqs.output_tokens) == src["output_lens"]
    # Recomputed with qwen3lab's rules from the rows, the figures are vLLM's own.
    for key in ("p95_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p95_tpot_ms", "median_itl_ms", "p99_e2el_ms",
                "output_throughput", "request_throughput", "completed", "duration"):
        assert run[key] == pytest.approx(src[key], rel=1e-6), key
    assert np.allclose(reqs.e2el, src["latencies"]) and np.allclose([c[0] for c in reqs.chunk_times], src["ttfts"])


def test_vllm_bench_summary_only(store):
    (run_id,) = importers.import_files(store, [SUMMARY])
    run = store.run(run_id)
    assert store.request_counts([run_id]) == {}
    assert "without --save-detailed" in run["reason"]
    assert run["p99_e2el_ms"] == pytest.approx(json.loads(SUMMARY.read_text())["p99_e2el_ms"])
    assert run["request_goodput"] is None or np.isnan(run["request_goodput"])  # the tool's SLOs are not ours


def test_guidellm_rows(store):
    (run_id,) = importers.import_files(store, [GUIDELLM])
    src = json.loads(GUIDELLM.read_text())
    bench = src["benchmarks"][0]
    run = store.run(run_id)
    assert run["trial"] == "guidellm-benchmarks/concurrent@8" and run["info"]["import"]["tool_version"] == "0.8.1"
    reqs = store.requests([run_id])
    assert len(reqs) == bench["metrics"]["request_totals"]["successful"] == 40
    theirs = sorted(q["time_to_first_token_ms"] for q in bench["requests"]["successful"])
    assert np.allclose(sorted(reqs.ttft * 1000), theirs)
    # GuideLLM takes its median from its own percentile method; numpy interpolates
    assert run["median_ttft_ms"] == pytest.approx(bench["metrics"]["time_to_first_token_ms"]["successful"]["median"], rel=0.01)
    assert run["duration"] == pytest.approx(bench["duration"])
    assert np.isnan(run["median_itl_ms"])  # only first and last token times: ITL unknown, not zero


def test_import_is_idempotent_and_runs_compare(store):
    first = importers.import_files(store, [DETAILED, SUMMARY, GUIDELLM])
    again = importers.import_files(store, [DETAILED, SUMMARY, GUIDELLM])
    assert first == again and len(store.runs()) == 3
    data = compare.load_runs(store, first)
    assert len(data) == 2  # the summary-only file has no rows to rank
    w = compare.pick_winner(data, SLO(ttft_p95_ms=5000))
    assert w.winner is not None and w.margin is not None and w.margin.low <= w.margin.estimate <= w.margin.high


def test_append_result_files_hold_one_result_a_line(store, tmp_path):
    lines = tmp_path / "appended.json"
    lines.write_text(DETAILED.read_text().strip() + "\n" + SUMMARY.read_text().strip() + "\n")
    ids = importers.import_files(store, [lines])
    assert len(ids) == 2 and sorted(store.runs().trial) == ["appended", "appended#1"]


def test_unknown_files_say_what_is_supported(store, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(importers.ImportFileError, match="Supported: vllm bench serve"):
        importers.import_files(store, [bad])
    with pytest.raises(importers.ImportFileError, match="no file"):
        importers.import_files(store, [tmp_path / "missing.json"])


def test_cli_import(tmp_path):
    db = tmp_path / "cli.duckdb"
    copy = tmp_path / "my result.json"
    shutil.copy(DETAILED, copy)
    out = subprocess.run([sys.executable, "-m", "qwen3lab.cli", "import", str(copy), str(GUIDELLM), "--db", str(db)],
                         capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    assert "2 run(s)" in out.stdout
    assert sorted(Store(db).runs().chapter) == ["guidellm", "vllm-bench-serve"]
