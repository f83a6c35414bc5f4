"""Adaptive search: infeasible suggestions never launch; a search stopped by SIGTERM resumes and re-runs nothing finished."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from qwen3lab.experiment import files as xp
from qwen3lab.measure import search as se
from qwen3lab.measure import suggestions
from qwen3lab.store import Store

from .conftest import REPO, TINY


def _experiment(tmp_path, space, **search) -> str:
    doc = {"name": "search-test", "gpu": "cpu", "engine": TINY,
           "workload": {"num_requests": 8, "mix": "fixed-128", "concurrency": 4, "warmup_requests": 1},
           "slo": {"ttft_ms": 5000},
           "search": {"space": space, "objective": "goodput", "sampler": "grid", "budget": {"trials": 2}, **search}}
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def test_infeasible_suggestions_are_stored_as_pruned_and_never_launched(tmp_path):
    # The tiny Qwen3 allows 40960 positions without YaRN, and a KV block must be a multiple of 16: pre-flight
    # refuses all four points, so no server may start and no run row may be written.
    path = _experiment(tmp_path, {"engine.max_model_len": [65536, 131072], "engine.block_size": [32, 40]})
    store = Store(tmp_path / "s.duckdb")
    result = se.run_search(path, store.path, str(tmp_path / "runs"))
    assert [t.state for t in result.history] == ["pruned"] * 4 and result.best is None
    assert "every grid point" in result.stopped
    assert all("max_model_len" in t.reason or "block_size" in t.reason for t in result.history)
    assert store.runs().empty and store.capacities().empty and not (tmp_path / "runs").exists()
    stored = store.search_trials(result.study)
    assert list(stored.state) == ["pruned"] * 4 and stored.reason.str.startswith("pre-flight").all()


def test_two_objectives_run_nsga2_and_report_exactly_the_non_dominated_points(tmp_path, monkeypatch):
    # The search logic alone, no server: each configuration's goodput and P95 TTFT are made up from its flags.
    # More sequences serve more and wait longer, up to 16; 32 serves no more than 16 and waits longer (dominated);
    # more batched tokens serve a little more and wait a little longer; one configuration crashes.
    measured = []

    def made_up(search, trial, verdict, store, runs_dir, path, machine, gpu_id, progress):
        seqs, tokens = trial.engine.max_num_seqs, trial.engine.max_num_batched_tokens
        measured.append((seqs, tokens))
        if (seqs, tokens) == (8, 2048):
            return se.SearchTrial(-1, {}, "failed", reason="made-up crash", trial_key=trial.key)
        return se.SearchTrial(-1, {}, "complete", value=min(seqs, 16) / 4 + (tokens == 4096) * 0.5,
                              value2=10.0 * seqs + (tokens == 4096) * 5, trial_key=trial.key, run_id=f"run-{seqs}-{tokens}")

    monkeypatch.setattr(suggestions, "_measure", made_up)
    space = {"engine.max_num_seqs": [4, 8, 16, 32], "engine.max_num_batched_tokens": [2048, 4096]}
    path = _experiment(tmp_path, space, objective=["goodput", "p95_ttft_ms"], budget={"trials": 8})
    store = Store(tmp_path / "s.duckdb")
    result = se.run_search(path, store.path, str(tmp_path / "runs"))
    assert result.sampler == "NSGAIISampler" and "every grid point" in result.stopped and len(measured) == 8
    done = [t for t in result.history if t.state == "complete"]
    beaten = lambda a, b: b.value >= a.value and b.value2 <= a.value2 and (b.value, b.value2) != (a.value, a.value2)  # noqa: E731
    want = [t.number for t in done if not any(beaten(t, o) for o in done)]
    assert [t.number for t, _ in result.front] == want
    assert 0 < len(want) < len(done)  # some measured points are dominated (seqs 32), the failed one is on no front
    out = result.as_dict()
    assert [f["number"] for f in out["front"]] == want and out["sampler"] == "NSGAIISampler"
    for f, (t, trial) in zip(out["front"], result.front):
        assert f["values"] == {"goodput": t.value, "p95_ttft_ms": t.value2} and f["run_id"] == t.run_id
        assert f"--max-num-seqs {t.params['engine.max_num_seqs']}" in f["launch_command"] and f["trial"] == trial.name
    assert set(store.search_trials(result.study).objectives) == {"goodput,p95_ttft_ms"}
    from rich.console import Console

    from qwen3lab import terminal

    console = Console(record=True, width=200)
    console.print(terminal.search_table(result))
    line = ", ".join(f"#{t.number} {t.value:g} / {t.value2:g}" for t, _ in result.front)
    assert f"Pareto front (goodput max and p95_ttft_ms min): {line}" in " ".join(console.export_text().split())
    # Resumed from DuckDB alone: nothing measured again, the same front.
    again = se.run_search(path, store.path, str(tmp_path / "runs"))
    assert len(measured) == 8 and [t.number for t, _ in again.front] == want


def test_a_search_space_with_a_bad_key_is_refused_before_anything_runs(tmp_path):
    path = _experiment(tmp_path, {"max_num_seqs": [4, 8]})
    with pytest.raises(Exception) as got:
        xp.load(path)
    assert "search.space" in str(got.value) and "engine.FIELD" in str(got.value)


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (got := predicate()) is not None:
            return got
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigterm_mid_search_then_resume_reruns_nothing_finished(tmp_path):
    # Grid order: seqs 4 (measured), seqs 4 at 131072 (pruned), seqs 8 (SIGTERM while it runs), ...
    path = _experiment(tmp_path, {"engine.max_num_seqs": [4, 8, 16], "engine.max_model_len": [2048, 131072]})
    db = str(tmp_path / "s.duckdb")
    store = Store(db)
    cmd = [sys.executable, "-m", "qwen3lab.cli", "search", path, "--db", db, "--runs-dir", str(tmp_path / "runs"),
           "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def second_running():
            df = store.search_trials()
            if df.empty or not (df.state == "complete").any():
                return None
            running = df[(df.state == "running") & (df.number > df[df.state == "complete"].number.min())]
            return None if running.empty else df
        first = _wait(second_running, 900, "the first trial to finish and the next to start")
        family = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, "the interrupted trial's server outlived the search"
    done = first[first.state == "complete"].iloc[0]
    stopped = store.search_trials()
    assert "interrupted" in set(stopped.state) and "running" not in set(stopped.state)

    got = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert got.returncode == 0, got.stderr[-3000:]
    result = json.loads(got.stdout)
    history = {h["number"]: h for h in result["history"]}
    assert history[int(done.number)]["run_id"] == done.run_id  # the finished trial kept its run
    runs = store.runs()
    measured = runs[runs.status == "ok"]
    assert measured.trial_key.value_counts().max() == 1  # nothing finished was measured twice
    # The signal lands before or after the interrupted trial's run row is written: either way none is left running.
    assert len(measured) == 2 and set(runs.status) <= {"ok", "interrupted"}
    assert [h["state"] for h in result["history"]].count("complete") == 2
    assert result["best"]["value"] == max(h["value"] for h in result["history"] if h["state"] == "complete")
    assert result["best"]["launch_command"] and "--max-num-seqs" in result["best"]["launch_command"]


def _charts(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _numbers(values) -> list:
    """A trace's numbers as a list: plotly writes a numeric array into the page as base64 of its dtype."""
    if isinstance(values, dict):
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).tolist()
    return list(values)


def test_capacity_page_shows_a_search_history_best_so_far_importance_and_front(tmp_path, monkeypatch):
    pytest.importorskip("streamlit")
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    path = _experiment(tmp_path, {"engine.max_model_len": [65536, 131072]}, objective=["goodput", "p95_ttft_ms"])
    store = Store(tmp_path / "s.duckdb")
    study = se.run_search(path, store.path, str(tmp_path / "runs")).study
    store.begin_run(trial="placeholder", status="skipped")  # the dashboard lists runs first; a search-only DB has none
    monkeypatch.setenv("QWEN3LAB_DB", store.path)
    st.cache_data.clear()
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=120)
    at.run()
    at.switch_page("views/capacity.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert "2 pruned" in "\n".join(c.value for c in at.caption)
    assert len(at.get("plotly_chart")) == 1  # the history; no importance without three measured trials, no front

    # Three measured configurations, written as a search writes them: the best-so-far line, parameter
    # importance and the front (#2 and #3; #4 serves less than #3 and waits longer) appear.
    for number, (length, goodput, ttft) in enumerate([(1024, 1.0, 100.0), (2048, 2.0, 300.0), (4096, 1.5, 400.0)], 2):
        store.add_search_trial(study=study, number=number, experiment="search-test", params_json={
            "engine.max_model_len": length}, objectives="goodput,p95_ttft_ms", state="running", trial=f"len-{length}")
        store.finish_search_trial(study, number, "complete", value=goodput, value2=ttft, run_id=f"run-{number}")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    history, front, importance = _charts(at)
    best = next(t for t in history["data"] if t.get("name") == "best so far")
    assert _numbers(best["y"]) == [1.0, 2.0, 2.0]
    line = next(t for t in front["data"] if t.get("name") == "Pareto front")
    assert (_numbers(line["x"]), _numbers(line["y"])) == ([100.0, 300.0], [1.0, 2.0])
    assert "importance" in importance["layout"]["title"]["text"]
    assert _numbers(importance["data"][0]["x"]) == ["engine.max_model_len"]


def test_the_shipped_search_space_reads_as_optuna_distributions():
    """A whole-number range without a step (experiments/cpu-tiny-search.yaml) is an integer distribution."""
    import optuna

    exp = xp.load(REPO / "experiments" / "cpu-tiny-search.yaml")
    dists = se.distributions(exp.search)
    tokens = dists["engine.max_num_batched_tokens"]
    assert isinstance(tokens, optuna.distributions.IntDistribution) and tokens.log and (tokens.low, tokens.high) == (256, 4096)
    assert dists["engine.kv_cache_dtype"].choices == ("auto", "fp8")
