"""The DuckDB store on a real file: schema, a run's life, and a reader beside a writer in another process."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import duckdb
import pytest

from qwen3lab.loadgen import RequestRecord
from qwen3lab.store import SCHEMA_VERSION, Store, StoreError


def _rec(i, ok=True):
    r = RequestRecord(i, "chat", 10, 5, False, i == 0, sent_at=0.1 * i)
    if ok:
        r.ttft, r.e2el, r.chunk_times, r.prompt_tokens, r.output_tokens = 0.02, 0.1, [0.02, 0.05, 0.1], 10, 5
    else:
        r.error = "ConnectionRefused"
    return r


def test_run_row_before_and_after(store):
    run_id = store.begin_run(experiment="e", chapter="c", trial="t", config_json={"a": 1})
    assert store.run(run_id)["status"] == "running"
    store.add_requests(run_id, [_rec(i) for i in range(5)] + [_rec(5, ok=False)])
    store.add_samples(run_id, [(0.0, "vllm", "vllm:num_requests_running", 3.0)])
    store.finish_run(run_id, "ok", summary={"completed": 4, "output_throughput": 12.5, "p95_ttft_ms": 20.0})
    row = store.run(run_id)
    assert row["status"] == "ok" and row["completed"] == 4 and row["summary"]["output_throughput"] == 12.5
    assert row["config"] == {"a": 1}
    reqs = store.requests([run_id])
    assert len(reqs) == 5 and list(reqs.chunk_times.iloc[0]) == [0.02, 0.05, 0.1]  # warmup excluded
    assert len(store.requests([run_id], measured_only=False)) == 6
    assert store.samples([run_id]).value.tolist() == [3.0]
    assert store.schema_version() == SCHEMA_VERSION


def test_migrations_from_an_empty_file_and_refuse_newer(tmp_path):
    path = tmp_path / "x.duckdb"
    Store(path).begin_run(experiment="e")
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO schema_version VALUES (?, now())", [SCHEMA_VERSION + 1])
    con.close()
    with pytest.raises(StoreError, match="newer"):
        Store(path).begin_run(experiment="e")


def test_no_database_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="run an experiment first"):
        Store(tmp_path / "missing.duckdb").run("x")
    assert Store(tmp_path / "missing.duckdb").runs().empty


def test_reader_waits_for_a_writer_in_another_process(store):
    run_id = store.begin_run(experiment="e")
    # Another process holds the write lock for a moment, as a sweep does while it writes.
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import duckdb, time, sys
        con = duckdb.connect({store.path!r})
        print("locked", flush=True)
        time.sleep(1.5)
        con.close()
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    assert store.run(run_id)["experiment"] == "e"  # waited, then read: no lock error reached us
    store.update_run(run_id, status="ok")
    holder.wait(timeout=10)
    assert store.run(run_id)["status"] == "ok"
