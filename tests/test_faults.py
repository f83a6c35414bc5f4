"""Faults, injected for real: qwen3lab SIGKILLed mid-run, the database's disk full, the database held by another
process, two sweeps on one file, the dashboard stopped with SIGTERM or SIGKILL. After each, what was measured is
in DuckDB after the next start, no trial ran twice, and no process and no port are left behind.

qwen3lab runs as its own process here (`python -m qwen3lab.cli run`), so a kill is a kill. The runs that only
need a server measure the session's tiny vLLM server as an endpoint; the SIGKILL test launches its own.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from qwen3lab.measure import engine
from qwen3lab.store import Store

from .conftest import REPO, TINY, spooled_requests

TOKENIZER = str(engine.resolve_model_path("builtin:qwen3-tiny"))


def experiment(tmp_path: Path, engine_yaml: str, trials=("a",), num_requests: int = 30,
               request_rate: float | None = None) -> Path:
    path = tmp_path / "faults.yaml"
    path.write_text(textwrap.dedent(f"""
        name: faults
        engine: {engine_yaml}
        workload:
          num_requests: {num_requests}
          concurrency: 2
          request_rate: {request_rate if request_rate else "null"}
          mix: [{{name: short, prompt_tokens: 16, output_tokens: 16}}]
        trials: [{', '.join('{name: %s}' % t for t in trials)}]
    """))
    return path


def endpoint_experiment(tmp_path, server, **kw) -> Path:
    return experiment(tmp_path, json.dumps({"kind": "endpoint", "url": server.base_url, "model": server.model_name,
                                            "tokenizer": TOKENIZER}), **kw)


def start_run(exp: Path, db: Path, runs: Path, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "qwen3lab.cli", "run", str(exp), "--db", str(db),
                             "--runs-dir", str(runs)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, env={**os.environ, "COLUMNS": "200", **env})


def finish(proc: subprocess.Popen, timeout: float = 900) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := condition():
            return got
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"qwen3lab exited before {what}:\n{proc.stdout.read()}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def trial_runs(db: Path):
    return Store(db).runs(experiment="faults")


def test_qwen3lab_sigkilled_then_resumed(tmp_path):
    """SIGKILL qwen3lab (a closed lid, the OOM killer) while the embedded default serves its load: its vLLM
    server dies with it, the row is `running`; the next start stores the spooled requests, marks the run
    interrupted and runs the trial again."""
    mark = uuid.uuid4().hex
    exp = experiment(tmp_path, json.dumps(TINY), num_requests=40)
    db, runs = tmp_path / "k.duckdb", tmp_path / "runs"
    proc = start_run(exp, db, runs, QWEN3LAB_FAULT_MARK=mark)
    wait_for(lambda: spooled_requests(runs) >= 4, 900, "4 spooled requests", proc)
    proc.kill()
    proc.wait()
    kept = spooled_requests(runs)
    (log,) = runs.glob("*/server.log")
    port = int(json.loads(log.read_text().splitlines()[0].removeprefix("# qwen3lab exec: "))[-1])

    def marked():
        out = []
        for p in psutil.process_iter():
            try:
                if p.environ().get("QWEN3LAB_FAULT_MARK") == mark:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    wait_for(lambda: not marked(), 60, "the orphaned vLLM server to exit (PR_SET_PDEATHSIG)")
    wait_for(lambda: engine.port_is_free(port), 30, f"port {port} to be free")
    (row,) = trial_runs(db).to_dict("records")
    assert row["status"] == "running" and row["owner_pid"] == proc.pid

    out = finish(start_run(exp, db, runs, QWEN3LAB_FAULT_MARK=mark))
    assert f"recovered run {row['run_id']}" in " ".join(out.split()), out
    df = trial_runs(db)
    old = df[df.run_id == row["run_id"]].iloc[0]
    assert old.status == "interrupted" and f"pid {proc.pid}" in old.reason
    assert Store(db).request_counts([row["run_id"]]) == {row["run_id"]: kept}
    new = df[df.run_id != row["run_id"]]
    assert list(new.status) == ["ok"] and int(new.completed.iloc[0]) == 40  # resumed: run again, whole
    assert not marked()


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs: room for a database, until the test fills it."""
    where = tmp_path / "small-disk"
    where.mkdir()
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(where)], capture_output=True,
                         text=True)
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {got.stderr.strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=True)


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    return filler


def test_disk_full_keeps_the_rows_and_the_next_start_stores_them(tiny_server, tmp_path, small_disk):
    exp = endpoint_experiment(tmp_path, tiny_server, num_requests=40)
    db, runs = small_disk / "full.duckdb", tmp_path / "runs"
    proc = start_run(exp, db, runs)
    wait_for(lambda: spooled_requests(runs) >= 2, 600, "2 spooled requests", proc)
    filler = fill(small_disk)
    out = " ".join(finish(proc).split())
    assert "DuckDB refused the run's writes" in out and "stored by the next qwen3lab start" in out, out
    assert spooled_requests(runs) == 40

    filler.unlink()  # the user frees space
    out = " ".join(finish(start_run(exp, db, runs)).split())
    assert "recovered run" in out and "earlier" in out, out  # finished from its spool, not run again
    (row,) = trial_runs(db).to_dict("records")
    assert row["status"] == "ok" and row["completed"] == 40
    assert Store(db).request_counts([row["run_id"]]) == {row["run_id"]: 40}
    assert not list(runs.glob("*/spool.jsonl"))  # ingested, then removed


def test_db_held_by_another_process(tiny_server, tmp_path):
    exp = endpoint_experiment(tmp_path, tiny_server, num_requests=150)  # still sending when the holder has the file
    db, runs = tmp_path / "locked.duckdb", tmp_path / "runs"
    proc = start_run(exp, db, runs, QWEN3LAB_LOCK_WAIT_S="2")
    wait_for(lambda: spooled_requests(runs) >= 2, 600, "2 spooled requests", proc)
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time\n"
                               f"con = duckdb.connect({str(db)!r}); print('held', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        out = " ".join(finish(proc).split())
        assert "DuckDB refused the run's writes" in out and "lock" in out.lower(), out
        assert proc.returncode == 1 and "cannot read the results table now" in out  # said, not a traceback
    finally:
        holder.kill()
        holder.wait()
    out = " ".join(finish(start_run(exp, db, runs)).split())
    assert "recovered run" in out, out
    (row,) = trial_runs(db).to_dict("records")
    assert row["status"] == "ok" and Store(db).request_counts([row["run_id"]]) == {row["run_id"]: 150}


def test_two_sweeps_on_one_db_never_run_a_trial_twice(tiny_server, tmp_path):
    # Paced: each trial sends for 30 s, so the second sweep (a process start, imports) is up while the first
    # still holds its first trial, however loaded the machine.
    exp = endpoint_experiment(tmp_path, tiny_server, trials=("a", "b"), num_requests=60, request_rate=2.0)
    db, runs = tmp_path / "shared.duckdb", tmp_path / "runs"
    first = start_run(exp, db, runs)
    wait_for(lambda: list(runs.glob("*/spool.jsonl")), 600, "the first sweep's first trial", first)
    second = start_run(exp, db, runs)
    outs = [" ".join(finish(p).split()) for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, outs
    assert any("held by run" in o and "not run twice" in o for o in outs), outs
    df = trial_runs(db)
    assert sorted(df.trial) == ["a", "b"] and set(df.status) == {"ok"}, (outs, df)  # one run each, both measured


def _dashboard(tmp_path) -> tuple[subprocess.Popen, int]:
    port = engine.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "qwen3lab.cli", "dashboard", "--db", str(tmp_path / "d.duckdb"),
                             "--port", str(port)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own group: only the signal we send reaches it
    wait_for(lambda: not engine.port_is_free(port), 180, "the dashboard to listen", proc)
    listening = [c for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
                 and c.status == psutil.CONN_LISTEN]
    assert listening and {c.laddr.ip for c in listening} == {"127.0.0.1"}  # by default, this machine only
    return proc, port


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_dashboard_stopped_leaves_no_child_and_no_port(tmp_path, sig):
    proc, port = _dashboard(tmp_path)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children  # the Streamlit server
    os.kill(proc.pid, sig)  # to qwen3lab only, as docker stop or a process manager sends it
    proc.wait(timeout=30)
    gone, alive = psutil.wait_procs(children, timeout=20)
    assert alive == []
    wait_for(lambda: engine.port_is_free(port), 20, f"port {port} to be free")


class DroppingProxy:
    """A real TCP proxy in front of the session's vLLM server that cuts every `every`-th streamed request's
    connection once its answer has started (600 bytes in): a load balancer or a network dropping connections
    mid-stream. With `hang_after=N`, from the N-th request on it forwards nothing more and keeps every
    connection open once an answer has started: a server that is healthy, then sends no tokens (hung)."""

    def __init__(self, upstream_port: int, every: int = 0, hang_after: int | None = None):
        import asyncio
        import threading

        self.upstream_port, self.every, self.seen, self.drops = upstream_port, every, 0, 0
        self.hang_after = hang_after
        self.loop = asyncio.new_event_loop()
        self.port = engine.free_port()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _serve(self):
        import asyncio

        async def handle(client_r, client_w):
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            state = {"answer": 0, "cut": False}  # bytes of the current answer; cut this request's stream?

            async def requests_in():
                try:
                    while data := await client_r.read(4096):
                        if data.startswith(b"POST /v1/"):  # a new streamed request on this connection
                            self.seen += 1
                            cut = (self.seen >= self.hang_after if self.hang_after is not None
                                   else self.seen % self.every == 0)
                            state.update(answer=0, cut=cut)
                        up_w.write(data)
                        await up_w.drain()
                except (ConnectionError, OSError):
                    pass
                finally:
                    up_w.close()

            async def answers_out():
                try:
                    while data := await up_r.read(256):
                        state["answer"] += len(data)
                        if state["cut"] and state["answer"] > 600:  # mid-stream: tokens have started
                            if self.hang_after is not None:
                                continue  # hung: the bytes go nowhere, the connection stays open
                            self.drops += 1
                            client_w.transport.abort()
                            up_w.transport.abort()
                            return
                        client_w.write(data)
                        await client_w.drain()
                    if state["cut"] and self.hang_after is not None:
                        await asyncio.sleep(3600)  # hung: the answer never ends (until the client gives up)
                except (ConnectionError, OSError):
                    pass
                finally:
                    client_w.close()

            await asyncio.gather(requests_in(), answers_out())

        async def main():
            self.server = await asyncio.start_server(handle, "127.0.0.1", self.port)
            self.ready.set()
            await self.server.serve_forever()

        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(main())
        except BaseException:  # noqa: BLE001 - stopped by close()
            pass
        finally:  # end the connections still open (a hung one sleeps) before the loop is dropped
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)  # the thread then ends each connection, closes the loop
        self.thread.join(10)


def test_endpoint_that_drops_connections_mid_stream(tiny_server, tmp_path):
    """Requests cut mid-stream are stored as failed with their error; the others are measured; the next
    trial proceeds."""
    from qwen3lab.experiment.spec import EndpointConfig, Trial
    from qwen3lab.measure import runner

    from .conftest import small_workload

    proxy = DroppingProxy(tiny_server.port, every=5)  # every 5th streamed request is cut
    store = Store(tmp_path / "drop.duckdb")
    try:
        cfg = EndpointConfig(kind="endpoint", url=f"http://127.0.0.1:{proxy.port}", model=tiny_server.model_name,
                             tokenizer=TOKENIZER)
        result = runner.run_trial(Trial(experiment="faults", name="dropping", engine=cfg,
                                        workload=small_workload(num_requests=16, concurrency=2)), store, tmp_path)
    finally:
        proxy.close()
    assert proxy.drops >= 1
    kept = store.requests([result.run_id])
    failed = kept[kept.error.notna()]
    assert len(kept) == 16 and 1 <= len(failed) < 16, kept[["idx", "error"]]
    assert failed.error.str.contains("stream cut before \\[DONE\\]").all(), failed.error.tolist()
    assert result.status == "ok" and f"{len(failed)} requests failed" in result.reason
    cfg = EndpointConfig(kind="endpoint", url=tiny_server.base_url, model=tiny_server.model_name, tokenizer=TOKENIZER)
    after = runner.run_trial(Trial(experiment="faults", name="after", engine=cfg,
                                   workload=small_workload(num_requests=4, concurrency=2)), store, tmp_path)
    assert after.status == "ok" and after.summary["completed"] == 4


def test_server_healthy_then_silent_is_stored_as_hung_within_the_stall_timeout(tiny_server, tmp_path):
    """Healthy, then no tokens: the requests in flight fail after workload.stall_timeout_s (not the 600 s
    request timeout), sending stops, the run is stored as timeout (hung) with what finished; the next trial runs."""
    from qwen3lab.experiment.spec import EndpointConfig, Trial
    from qwen3lab.measure import runner

    from .conftest import small_workload

    proxy = DroppingProxy(tiny_server.port, hang_after=6)
    store = Store(tmp_path / "hung.duckdb")
    workload = small_workload(num_requests=40, concurrency=2).model_copy(update={"stall_timeout_s": 3.0})
    began = time.monotonic()
    try:
        cfg = EndpointConfig(kind="endpoint", url=f"http://127.0.0.1:{proxy.port}", model=tiny_server.model_name,
                             tokenizer=TOKENIZER)
        result = runner.run_trial(Trial(experiment="faults", name="hung", engine=cfg, workload=workload), store,
                                  tmp_path)
    finally:
        proxy.close()
    took = time.monotonic() - began
    assert result.status == "timeout" and "hung: no token for 3 s" in result.reason, result.reason
    assert took < 120, f"{took:.0f} s: the stall watch did not cut the load"
    kept = store.requests([result.run_id], measured_only=False)
    hung = kept[kept.error.fillna("").str.contains("the server hung")]
    assert 1 <= len(hung) <= 2 and len(kept) < 40  # the requests in flight (concurrency 2); sending stopped
    assert kept.error.isna().sum() >= 4  # what finished before the hang is kept
    cfg = EndpointConfig(kind="endpoint", url=tiny_server.base_url, model=tiny_server.model_name, tokenizer=TOKENIZER)
    after = runner.run_trial(Trial(experiment="faults", name="after-hung", engine=cfg,
                                   workload=small_workload(num_requests=4, concurrency=2)), store, tmp_path)
    assert after.status == "ok" and after.summary["completed"] == 4


def test_port_taken_fails_with_the_reason_and_leaves_nothing(tmp_path):
    """Another program took the port between qwen3lab picking it and vLLM binding it."""
    import socket

    from qwen3lab.errors import EngineError

    from .conftest import tiny_config, vllm_processes

    before = {p.pid for p in vllm_processes()}  # the session's shared server may be running
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    port = squatter.getsockname()[1]
    try:
        with pytest.raises(EngineError) as info:
            with engine.launch(tiny_config(), tmp_path / "server.log", ready_timeout_s=600, port=port):
                pass
    finally:
        squatter.close()
    assert info.value.outcome == "failed" and "address already in use" in info.value.reason.lower(), info.value.reason
    wait_for(lambda: not [p for p in vllm_processes() if p.pid not in before], 30, "no vLLM process of this test")
