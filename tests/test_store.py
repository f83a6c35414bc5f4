"""The DuckDB store on a real file: schema, a run's life, a reader beside a writer in another process, threads together."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import duckdb
import pytest

from qwen3lab.measure.loadgen import RequestRecord
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


def test_threads_of_one_process_write_and_read_together(tmp_path):
    # The runner's request flusher writes from its own thread while the runner writes samples and the dashboard's
    # sessions read: without one connection at a time per file, DuckDB fails ("python_arrow_scan does not exist").
    path = tmp_path / "threads.duckdb"
    run_id = Store(path).begin_run(experiment="threads", trial="t")
    errors: list[str] = []

    def work(worker: int, n: int = 400) -> None:
        store = Store(path)  # a Store of its own: its first call migrates, then registers an Arrow table
        for i in range(n):
            try:
                store.add_samples(run_id, [(float(i), f"w{worker}", "m", 1.0)])
                store.runs()
            except Exception as exc:  # noqa: BLE001 - collected, the assertion names them
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(w,)) for w in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(Store(path).samples([run_id])) == 5 * 400


def test_claim_counts_another_processes_launch_since_the_caller_looked(store):
    """Two sweeps on one file: a launch another live qwen3lab began, or finished, after this one looked for the
    trial's runs is not run again; one it cut short is, and this process's own earlier launches never block."""
    import psutil

    from qwen3lab.store import Owner, now

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        them = Owner(other.pid, Owner.me().host, psutil.Process(other.pid).create_time())
        theirs = store.claim_run("k", now(), them, experiment="e", chapter="c", trial="t").run_id
        looked = now()  # we plan while theirs runs ...
        store.finish_run(theirs, "ok")  # ... and it finishes before we claim
        claim = store.claim_run("k", looked, Owner.me(), experiment="e", chapter="c", trial="t")
        assert claim.run_id is None and claim.held_by["run_id"] == theirs and "finished it meanwhile" in claim.reason

        cut = store.claim_run("k2", now(), them, experiment="e", chapter="c", trial="t2").run_id
        looked = now()
        store.finish_run(cut, "interrupted", "stopped")
        assert store.claim_run("k2", looked, Owner.me(), experiment="e", chapter="c", trial="t2").run_id

        looked = now()
        mine = store.claim_run("k3", looked, Owner.me(), experiment="e", chapter="c", trial="t3").run_id
        store.finish_run(mine, "ok")
        again = store.claim_run("k3", looked, Owner.me(), experiment="e", chapter="c", trial="t3").run_id
        assert again and again != mine  # repeats: a second launch of our own
        held = store.claim_run("k3", looked, them, experiment="e", chapter="c", trial="t3")
        assert held.run_id is None and held.held_by["run_id"] == again and "still running" in held.reason
    finally:
        other.kill()
        other.wait()
