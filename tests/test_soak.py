"""Soak: durations and trial names checked first, then a real `qwen3lab soak` on the tiny Qwen3 whose server is
SIGKILLed mid-soak: counted as a crash, started again, every window stored, drift computed, the Drift page shown."""
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

from qwen3lab.analysis import compare, drift
from qwen3lab.errors import Qwen3LabError
from qwen3lab.experiment import files as xp
from qwen3lab.experiment.spec import SLO
from qwen3lab.measure import soak as sk
from qwen3lab.store import Store

from .conftest import REPO, TINY


@pytest.mark.parametrize("text, seconds", [("72h", 259200), ("1h30m", 5400), ("45s", 45), ("600", 600),
                                           ("2d", 172800), ("1.5m", 90)])
def test_durations_read_as_people_write_them(text, seconds):
    assert sk.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["3 weeks", "h", "-5", "0", "10x"])
def test_a_bad_duration_names_the_option_and_the_forms(text):
    with pytest.raises(Qwen3LabError) as got:
        sk.parse_duration(text)
    assert "--duration" in str(got.value) and repr(text.strip().lower()) in str(got.value)


def test_the_default_window_is_a_twelfth_within_bounds():
    assert sk.default_window_s(72 * 3600) == 600 and sk.default_window_s(60) == 10 and sk.default_window_s(240) == 20


def test_trial_is_picked_by_name_or_the_soak_chapter(tmp_path):
    trials = xp.expand(xp.load(REPO / "experiments/cpu-tiny.yaml"))
    assert sk.pick_trial(trials, None, "x").chapter == "soak"
    assert sk.pick_trial(trials, "scheduler/enforce-eager", "x").name == "enforce-eager"
    with pytest.raises(Qwen3LabError) as got:
        sk.pick_trial(trials, "no-such-trial", "cpu-tiny.yaml")
    assert "--trial 'no-such-trial'" in str(got.value) and "baseline/" in str(got.value)


EXPERIMENT = {
    "name": "soak-test", "gpu": "cpu", "engine": TINY,
    "workload": {"mix": [{"name": "q", "prompt_tokens": 32, "output_tokens": 32}], "num_requests": 20,
                 "concurrency": 2, "warmup_requests": 1},
    "slo": {"ttft_ms": 2000},
    "chapters": {"soak": {"trials": [{"name": "steady"}]}, "other": {"trials": [{"name": "x"}]}},
}


def _servers_under(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for p in kids:
        try:
            if "vllm.entrypoints" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out



def test_drift_reads_a_trend_over_the_windows_of_real_runs(tmp_path):
    """Real stored runs (tests/data's cpu-tiny runs of one workload) filed as the windows of one soak, as the soak
    stores them: every metric's first-to-last change along the line through the windows, with its interval;
    "drift" only where that interval is on the worse side, none from two windows (their spread is unknown)."""
    from tests import dashdata

    store = dashdata.build(tmp_path / "soak.duckdb", with_extras=False)
    runs = store.runs(status="ok").sort_values("started_at")
    soak_id = store.begin_soak(experiment="cpu-tiny", chapter="soak", trial_key="k")
    for i, run_id in enumerate(runs.run_id):
        store.update_run(run_id, soak_id=soak_id, soak_window=i)
    got = drift.first_last(store, soak_id, SLO())
    assert got["windows"] == len(runs) >= 3 and set(got["metrics"]) == set(drift.DRIFT_METRICS)
    for name, m in got["metrics"].items():
        assert m["low"] < m["change_pct"] < m["high"] and m["first"] > 0 and m["last"] > 0
        assert name not in got["drift"] or (m["high"] < 0 if drift.DRIFT_METRICS[name] else m["low"] > 0)
    for run_id in runs.run_id[2:]:
        store.update_run(run_id, soak_window=None, soak_id=None)
    two = drift.first_last(store, soak_id, SLO())
    assert two["windows"] == 2 and two["drift"] == [] and "spread is unknown" in two["note"]


@pytest.fixture(scope="module")
def soaked(tmp_path_factory):
    """`qwen3lab soak --duration 30s --window 8s`, its server SIGKILLed in its second window."""
    tmp = tmp_path_factory.mktemp("soak")
    path = tmp / "soak.yaml"
    path.write_text(yaml.safe_dump(EXPERIMENT, sort_keys=False))
    db = tmp / "soak.duckdb"
    proc = subprocess.Popen([sys.executable, "-m", "qwen3lab.cli", "soak", str(path), "--duration", "30s",
                             "--window", "8s", "--max-restarts", "2", "--db", str(db), "--runs-dir", str(tmp / "runs"),
                             "--json"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    killed = None
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and killed is None and proc.poll() is None:
            time.sleep(0.5)
            if not db.exists():
                continue
            soaks = Store(db).soaks()
            if soaks.empty:
                continue
            windows = Store(db).soak_windows(list(soaks.soak_id))
            # inside the second window, its load under way: a kill between windows is counted too, but as no
            # window's crash (the next window finds the server gone)
            if not windows.empty and (windows.status == "ok").any() and \
                    ((windows.status == "running") & (windows.soak_window >= 1)).any():
                time.sleep(2)  # of the 8 s window
                (api,) = _servers_under(proc.pid)
                killed = api.pid
                os.kill(api.pid, signal.SIGKILL)
        out, errs = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed, "the first window was never stored"
    return path, Store(db), proc.returncode, out, errs, killed


def test_a_killed_server_is_counted_started_again_and_the_soak_goes_on(soaked):
    _, store, code, out, errs, killed = soaked
    assert code == 0, errs[-3000:]
    got = json.loads(out)
    assert got["status"] == "ok" and got["server_starts"] == 2 and got["crashes"] == 1 and got["ooms"] == 0, got
    assert "starting it again" in errs
    starts = [w["server_start"] for w in got["window_runs"]]
    assert starts == sorted(starts) and set(starts) == {1, 2}
    crashed = [w for w in got["window_runs"] if w["status"] == "crashed"]
    assert len(crashed) == 1 and "SIGKILL" in crashed[0]["reason"]
    assert not psutil.pid_exists(killed) or psutil.Process(killed).status() == psutil.STATUS_ZOMBIE
    (row,) = store.soaks().to_dict("records")
    assert (row["status"], row["crashes"], row["server_starts"], row["windows"]) == ("ok", 1, 2, len(starts))


def test_every_window_is_a_stored_run_with_memory_and_kv_samples(soaked):
    _, store, _, out, _, _ = soaked
    soak_id = json.loads(out)["soak_id"]
    w = drift.windows(store, soak_id)
    assert list(w.soak_window) == list(range(len(w))) and len(w) >= 3
    ok = w[w.status == "ok"]
    assert (ok.completed > 0).all() and (ok.server_rss_mib > 100).all()  # the server's tree: hundreds of MiB
    assert ok.kv_cache_usage.notna().all() and (ok.start_s.diff().dropna() > 0).all()
    assert store.requests(list(ok.run_id)).groupby("run_id").size().min() > 0


def test_drift_sets_the_last_window_against_the_first_with_intervals(soaked):
    _, store, _, out, _, _ = soaked
    got = json.loads(out)["drift"]
    assert set(got["metrics"]) == set(drift.DRIFT_METRICS)
    for m in got["metrics"].values():
        assert m["low"] <= m["change_pct"] <= m["high"] and m["first"] > 0 and m["last"] > 0
    # "drift" only where the interval excludes zero in the worse direction (and Holm over the metrics agrees);
    # with two ok windows the window-to-window spread is unknown: nothing is drift
    for name in got["drift"]:
        m = got["metrics"][name]
        assert m["high"] < 0 if drift.DRIFT_METRICS[name] else m["low"] > 0
    if got["windows"] < 3:
        assert got["drift"] == [] and "spread is unknown" in got["note"]


def test_soak_windows_stand_for_no_trial(soaked):
    """Compare, Winner and resume count launches of trials; a soak's windows are pieces of the soak."""
    _, store, _, out, _, _ = soaked
    windows = store.soak_windows([json.loads(out)["soak_id"]])
    assert (windows.status == "ok").sum() >= 2
    assert compare.chapter_trials(store, "soak-test", "soak", include_unreliable=True) == []
    for key in set(windows.trial_key):
        assert store.trial_runs(key).empty  # resume would not take a window for a launch of the trial


def test_drift_page_shows_the_soak(soaked, monkeypatch):
    pytest.importorskip("streamlit")
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    _, store, _, out, _, _ = soaked
    monkeypatch.setenv("QWEN3LAB_DB", store.path)
    st.cache_data.clear()
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=120)
    at.run()
    at.switch_page("views/drift.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert list(at.dataframe[0].value.soak_id) == [json.loads(out)["soak_id"]]
    assert set(at.dataframe[1].value.metric) == set(drift.DRIFT_METRICS)
    assert len(at.get("plotly_chart")) == 1
