"""Every dashboard page, run by Streamlit's AppTest against a real DuckDB file (real run rows, see dashdata.py)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from tests import dashdata  # noqa: E402
from qwen3lab.analysis import compare, export, stats
from qwen3lab.analysis import efficiency  # noqa: E402
from qwen3lab.experiment.spec import SLO  # noqa: E402
from qwen3lab.store import Store  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "dashboard" / "app.py")


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dash") / "dash.duckdb"
    dashdata.build(path)
    return path


@pytest.fixture()
def app(db, monkeypatch):
    monkeypatch.setenv("QWEN3LAB_DB", str(db))

    def make(page: str | None = None, **state) -> AppTest:
        import streamlit as st

        st.cache_data.clear()
        at = AppTest.from_file(APP, default_timeout=120)
        for k, v in state.items():
            at.session_state[k] = v
        at.run()
        if page:
            at.switch_page(page)
            at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at
    return make


def texts(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [e.value for kind in ("info", "warning", "success", "error", "caption")
                                              for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


def cpu_tiny_runs(db) -> list[str]:
    df = Store(db).runs(experiment="cpu-tiny", status="ok")
    return list(df.run_id)


def test_compare_is_the_landing_page(app, db):
    at = app()
    assert at.title[0].value == "Compare runs"
    assert at.session_state["experiment"] == "cpu-tiny"  # qwen3lab's own experiment, not the imports
    assert sorted(at.session_state["run_ids"]) == sorted(cpu_tiny_runs(db))
    assert len(at.get("plotly_chart")) == 4  # Pareto and 3 CDFs; the other tabs draw when opened
    assert "SLOs: P95 TTFT ≤ 1000 ms, P95 TPOT ≤ 100 ms" in texts(at)  # the experiment's own SLOs
    for tab in ("By request class", "Server metrics", "GPU"):
        at.session_state["compare_tab"] = tab
        at.run()
        assert not at.exception
        assert len(at.get("plotly_chart")) == 2, tab  # Pareto and the open tab's chart
    at.session_state["compare_tab"] = "Roofline"
    at.run()
    assert "No roofline for these runs: the run used vLLM's CPU engine" in texts(at)


def test_roofline_tab_shows_ceiling_and_efficiency_where_the_run_has_a_gpu(app, tmp_path, monkeypatch):
    # The fixture's runs are CPU runs (no roofline); one A100 run's summary, stored the way the runner stores it,
    # gets a ceiling. Its own file, so the other tests' runs stay as they are.
    path = tmp_path / "gpu.duckdb"
    store = dashdata.build(path, with_extras=False)
    cpu_run = cpu_tiny_runs(path)[0]
    summary = {"completed": 100, "failed": 0, "total_input_tokens": 51200, "total_output_tokens": 12800,
               "output_throughput": 300.0, "median_tpot_ms": 30.0, "median_ttft_ms": 150.0, "duration": 42.7}
    gpu_run = store.begin_run(experiment="a100-check", chapter="baseline", trial="bf16", engine_kind="vllm",
                              model="builtin:qwen3-14b", gpu="1x NVIDIA A100-SXM4-80GB",
                              config_json={"model": "builtin:qwen3-14b"}, workload_json={"concurrency": 8})
    store.finish_run(gpu_run, "ok", summary=summary)
    monkeypatch.setenv("QWEN3LAB_DB", str(path))
    at = app(run_ids=[cpu_run, gpu_run], experiment="(all experiments)", compare_tab="Roofline")
    assert len(at.get("plotly_chart")) == 2  # Pareto and the ceiling bars
    table = at.dataframe[-1].value
    want = efficiency.run_ceiling(store.run(gpu_run))
    assert len(table) == 1
    row = table.iloc[0]
    assert row.GPU == "a100-80g-sxm" and row.batch == 8 and row.bound == want["bound"]
    assert row["ceiling tok/s"] == pytest.approx(want["output_tok_s_ceiling"], abs=0.05)
    assert row.efficiency == f"{300.0 / want['output_tok_s_ceiling']:.0%}"
    assert "no ceiling (the run used vLLM's CPU engine" in texts(at)


def test_winner_page_ranks_under_the_users_slos(app, db):
    at = app("views/winner.py")
    at.number_input(key="slo_ttft_p95_ms").set_value(5000.0)
    at.number_input(key="slo_tpot_p95_ms").set_value(100.0)
    at.number_input(key="slo_e2el_p99_ms").set_value(None)
    next(b for b in at.button if b.label == "Pick the winner").click()
    at.run()
    assert not at.exception
    body = texts(at)
    ids = cpu_tiny_runs(db)
    expected = compare.pick_winner(compare.load_runs(Store(db), ids), SLO(ttft_p95_ms=5000, tpot_p95_ms=100))
    assert f"Winner: `{expected.winner.label}`" in body
    assert "95% CI" in body and "One launch per trial" in body  # the fixture's trials were launched once each
    assert "Can't tell" not in body and "Better:" not in body  # one launch a trial: no verdict
    ranking = at.dataframe[0].value
    assert list(ranking.run_id) == list(expected.ranking.run_id)
    assert at.session_state["slo"]["ttft_p95_ms"] == 5000.0

    # SLOs nothing meets: no winner, and the closest run is named.
    at.number_input(key="slo_ttft_p95_ms").set_value(1.0)
    next(b for b in at.button if b.label == "Pick the winner").click()
    at.run()
    assert "No winner under these SLOs" in texts(at) and "Closest:" in texts(at)


def test_runs_page_filters_and_shows_reasons(app, db):
    at = app("views/runs.py")
    table = at.dataframe[0].value
    assert len(table) == len(Store(db).runs())
    assert {"output_throughput", "p95_ttft_ms", "log", "notebook", "reason", "planner_kv_tokens",
            "vllm_kv_tokens"} <= set(table.columns)
    ok = table[table.status == "ok"]
    assert (ok.vllm_kv_tokens > 0).any()  # the planner's capacity stands beside vLLM's
    assert "block_size 8 is not supported" in texts(at) and "FP8 weights need" in texts(at)
    at.multiselect(key="filter_status").set_value(["failed", "skipped"])
    at.run()
    assert set(at.dataframe[0].value.status) == {"failed", "skipped"}
    at.multiselect(key="filter_status").set_value([])
    at.multiselect(key="filter_experiment").set_value(["imported"])
    at.run()
    assert set(at.dataframe[0].value.experiment) == {"imported"}
    assert "Imported from" in texts(at)


def test_export_page_shows_the_winners_commands(app, db):
    ids = cpu_tiny_runs(db)
    at = app("views/export.py", run_ids=ids, experiment="cpu-tiny", export_run=ids[-1])
    assert not at.code and "no checkpoint on the Hugging Face hub" in at.error[0].value  # the tiny test model
    at.text_input(key="export_model").set_value("Qwen/Qwen3-0.6B")
    at.run()
    codes = [c.value for c in at.code]
    ex = export.export_run(Store(db).run(ids[-1]), model="Qwen/Qwen3-0.6B")
    assert codes == [t.rstrip("\n") for t in (ex.shell, ex.docker, ex.compose, ex.kubernetes)]
    assert "\nvllm serve Qwen/Qwen3-0.6B " in ex.shell and "VLLM_CPU_KVCACHE_SPACE=1" not in codes[0].splitlines()[-1]
    at.text_input(key="export_host").set_value("0.0.0.0")
    at.number_input(key="export_port").set_value(9001)
    at.run()
    assert at.code[0].value.endswith("--host 0.0.0.0 --port 9001")


def test_claims_page(app, db):
    at = app("views/claims.py")
    table = at.dataframe[0].value
    assert list(table.columns[:3]) == ["verdict", "chapter", "trial"]  # the decisive column first
    compared = table[table.verdict != "not compared"]
    assert set(compared.trial) == {"max-num-seqs-4", "enforce-eager"} and set(compared.baseline) == {"max-num-seqs-128"}
    assert set(compared.verdict) == {stats.ONE_LAUNCH}  # the fixture's trials were launched once each
    assert compared["change (%)"].str.fullmatch(r"[+-]\d+\.\d").all()  # rounded to a tenth of a percent
    # every trial left out says why, in words, not a None
    assert (table[table.verdict == "not compared"]["why not compared"].str.len() > 10).all()
    assert not table.isin(["None", "nan"]).any().any()
    assert len(at.get("plotly_chart")) == 3


def test_file_page_shows_a_log(app, db, tmp_path):
    store = Store(db)
    log = tmp_path / "server.log"
    log.write_text("INFO starting\nINFO Application startup complete.\n")
    rid = cpu_tiny_runs(db)[0]
    old = store.run(rid)["log_path"]
    store.update_run(rid, log_path=str(log))
    try:
        import streamlit as st

        st.cache_data.clear()
        at = AppTest.from_file(APP, default_timeout=60)
        at.run()
        at.query_params["run"] = rid
        at.query_params["what"] = "log"
        at.switch_page("views/file.py")
        at.run()
        assert not at.exception
        assert "Application startup complete" in at.code[0].value
        for run, what, said in ((rid + "x", "log", f"names run `{rid}x`"), (rid, "secrets", "`what=secrets`")):
            at.query_params["run"], at.query_params["what"] = run, what  # a bad link: a message, no traceback
            at.run()
            assert not at.exception and said in at.error[0].value and "Fix:" in at.error[0].value
    finally:
        store.update_run(rid, log_path=old)


def test_no_database_says_make_demo(tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN3LAB_DB", str(tmp_path / "nothing-here.duckdb"))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception
    assert "make demo" in at.info[0].value


WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[2])
    from qwen3lab.store import Store
    s = Store(sys.argv[1])
    end = time.monotonic() + float(sys.argv[3])
    i = 0
    while time.monotonic() < end:
        rid = s.begin_run(experiment="live-sweep", chapter="c", trial=f"t{i}", engine_kind="vllm")
        s.add_requests(rid, [{"idx": j, "request_class": "fixed", "warmup": False, "ttft": 0.1, "e2el": 1.0,
                              "prompt_tokens": 10, "output_tokens": 5, "sent_at": j * 0.1,
                              "chunk_times": [0.1, 0.3, 0.5, 0.8, 1.0]} for j in range(200)])
        s.finish_run(rid, "ok", None, {"completed": 200, "failed": 0, "duration": 21.0, "output_throughput": 47.6})
        i += 1
    print(i)
""")


def test_pages_keep_working_while_a_sweep_writes(app, db, tmp_path):
    """Another process writes runs to the same file the whole time: no lock error reaches the page, and the
    new runs appear after Refresh."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db), str(ROOT), "12"], stdout=subprocess.PIPE, text=True)
    try:
        renders = 0
        while writer.poll() is None:
            for page in ("views/runs.py", "views/compare.py", "views/winner.py"):
                at = app(page)  # clears the cache: every render reads the file again
                assert not at.error and not at.exception
                renders += 1
        written = int(writer.stdout.read())
    finally:
        writer.kill() if writer.poll() is None else None
    assert writer.returncode == 0 and written > 0 and renders >= 3
    at = app("views/runs.py")
    assert (at.dataframe[0].value.experiment == "live-sweep").sum() == written
    Store(db).delete_runs(list(Store(db).runs(experiment="live-sweep").run_id))


def test_refresh_shows_new_runs(app, db):
    at = app("views/runs.py")
    before = len(at.dataframe[0].value)
    store = Store(db)
    rid = store.begin_run(experiment="cpu-tiny", chapter="scheduler", trial="late-arrival", engine_kind="vllm")
    try:
        next(b for b in at.sidebar.button if b.label == "Refresh").click()
        at.run()
        assert not at.exception
        assert len(at.dataframe[0].value) == before + 1
        assert "late-arrival" in set(at.dataframe[0].value.label.str.split("/").str[-1])
    finally:
        store.delete_runs([rid])


def open_committed(app, tmp_path, monkeypatch, name: str, page: str) -> AppTest:
    """A page of the dashboard on a copy of a committed results file (the committed file is never written)."""
    import shutil

    path = tmp_path / name
    shutil.copy(ROOT / "experiments" / "results" / name, path)
    monkeypatch.setenv("QWEN3LAB_DB", str(path))
    return app(page)


def test_the_committed_h200_results_show_in_the_dashboard(app, tmp_path, monkeypatch):
    """experiments/results/h200-qwen3-14b.duckdb: its chapters, vLLM's KV beside the planner's, both TTFTs."""
    at = open_committed(app, tmp_path, monkeypatch, "h200-qwen3-14b.duckdb", "views/runs.py")
    table = at.dataframe[0].value
    ok = table[table.status == "ok"]
    assert {"quantization", "block_size", "scheduler", "prefix_cache", "thinking_mode", "emulation"} <= \
        {label.split("/")[0] for label in ok.label}
    assert (ok.gpu.str.contains("H200")).all() and (ok.vllm_version == "0.26.0").all()
    # the opening burst left out; a run that is all burst (32 requests at concurrency 32) has no steady state
    steady = ok.dropna(subset=["steady_p95_ttft_ms"])
    assert len(steady) >= 10 and (steady.steady_p95_ttft_ms < steady.p95_ttft_ms).all()
    measured = ok[~ok.label.str.startswith("emulation")]
    assert ((measured.planner_kv_tokens / measured.vllm_kv_tokens - 1).abs() < 0.01).all()


def test_the_committed_h200_capacities_show_on_the_capacity_page(app, tmp_path, monkeypatch):
    """experiments/results/h200-qwen3-14b-capacity.duckdb: one capacity per configuration, ranked, with its curve."""
    at = open_committed(app, tmp_path, monkeypatch, "h200-qwen3-14b-capacity.duckdb", "views/capacity.py")
    ranked = at.dataframe[0].value
    ok = ranked[ranked.status == "ok"]
    assert list(ok.trial) == ["fp8-online", "bf16-defaults", "bf16-kv-fp8", "max-num-seqs-128"] or \
        list(ok.trial) == ["fp8-online", "bf16-kv-fp8", "bf16-defaults", "max-num-seqs-128"]
    # the bracket: the capacity is its last passing point, below the first failing one
    assert (ok.low == ok.capacity).all() and (ok.capacity < ok.high).all()
    assert len(at.get("plotly_chart")) >= 1


def test_the_committed_results_open_on_the_answer(app, tmp_path, monkeypatch):
    """Each committed H200 file opens on a non-empty answer: the largest group of comparable runs, its winner on
    Compare, Winner and Export; the capacity file on its Capacity page, the winner by capacity."""
    from qwen3lab.analysis import comparable
    from qwen3lab.measure import capacity as cap

    at = open_committed(app, tmp_path, monkeypatch, "h200-qwen3-14b.duckdb", None)
    store = Store(tmp_path / "h200-qwen3-14b.duckdb")
    groups = comparable.groups(store.runs())
    assert at.title[0].value == "Compare runs" and groups[0]["trials"] == max(g["trials"] for g in groups) > 2
    ids = at.session_state["run_ids"]
    assert sorted(ids) == sorted(groups[0]["run_ids"])
    label = at.selectbox(key="group").options[0]  # the picker lists groups by experiment, chapters and key
    assert all(str(c) in label for c in groups[0]["chapters"]) and groups[0]["key"] in label
    w = compare.pick_winner(compare.load_runs(store, ids), compare.stored_slo(store, "h200-qwen3-14b"))
    assert w.winner is not None and f"Winner: `{w.winner.label}`" in texts(at)
    at.switch_page("views/export.py")
    at.run()
    assert next(s for s in at.selectbox if s.label == "Run").value == w.winner.run_id  # Export opens on the group's winner
    assert at.code[0].value == export.export_run(store.run(w.winner.run_id)).shell.rstrip("\n")

    at = open_committed(app, tmp_path, monkeypatch, "h200-qwen3-14b-capacity.duckdb", None)
    store = Store(tmp_path / "h200-qwen3-14b-capacity.duckdb")
    assert at.title[0].value == "Capacity"
    top = cap.per_configuration(store.capacities()).sort_values("capacity", ascending=False).iloc[0]
    assert f"Winner by capacity: `{top.chapter}/{top.trial}`" in texts(at)
    # Compare ranks load points at one offered load only; two loads picked by hand are refused, naming the load
    runs = store.runs(status="ok")
    assert runs[runs.run_id.isin(at.session_state["run_ids"])].offered_load.nunique() == 1
    by_load = runs.drop_duplicates("offered_load")
    at.session_state["pending_selection"] = ("h200-qwen3-14b-capacity", list(by_load.run_id[:2]))
    at.switch_page("views/compare.py")
    at.run()
    assert "cannot be set against each other" in at.error[0].value and "load: request_rate" in at.error[0].value


def test_the_decisive_columns_come_first_with_blanks_for_missing_values(app, tmp_path, monkeypatch):
    """On the committed H200 file: Runs opens with when and on which vLLM, the Winner's ranking with whether and by
    how much a trial misses the SLOs; a missing value is an empty cell, not "None"."""
    at = open_committed(app, tmp_path, monkeypatch, "h200-qwen3-14b.duckdb", "views/runs.py")
    runs = at.dataframe[0].value
    assert list(runs.columns[:4]) == ["started_at", "label", "status", "vllm_version"]
    assert not runs.isin(["None", "nan"]).any().any() and runs.reason.isna().sum() == 0  # blank, not None
    # a missing number (this file has some) is drawn blank, not "None"
    assert runs.select_dtypes("number").isna().any().any() and at.dataframe[0].proto.placeholder == ""
    at.switch_page("views/winner.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    ranking = at.dataframe[0].value
    assert list(ranking.columns[:4]) == ["rank", "label", "slo_pass", "why_not"] and at.dataframe[0].proto.placeholder == ""
    missing = ranking[~ranking.slo_pass]
    assert len(missing) and (missing.why_not.str.len() > 0).all() and (ranking[ranking.slo_pass].why_not == "").all()


def test_workload_page_shows_what_the_runs_sent(app, db):
    """Prompt and output histograms hold every measured request of each picked run; arrivals and sessions beside."""
    import plotly.io

    ids = cpu_tiny_runs(db)[:2]
    at = app("views/workload.py", run_ids=ids, experiment="cpu-tiny")
    fig = plotly.io.from_json(at.get("plotly_chart")[0].proto.spec)
    reqs = Store(db).requests(ids)
    prompts = [t for t in fig.data if t.type == "histogram" and t.xaxis == "x"]
    assert len(prompts) == len(ids) and sum(len(t.x) for t in prompts) == len(reqs)
    assert sorted(x for t in prompts for x in t.x) == sorted(reqs.prompt_tokens)
    arrivals = [t for t in fig.data if t.type == "scatter"]
    assert sum(sum(t.y) for t in arrivals) == reqs.sent_at.notna().sum()
