"""The Ray executor on a real local multi-node Ray cluster (ray.cluster_utils.Cluster): a head without slots and
two nodes with one `vllm_slot` each, running short cpu-tiny trials on real vLLM servers.

Covers: the same rows as the local executor, provenance from the node, a node removed mid-trial (stored `lost`
with its partial rows, retried on the other node), a driver stopped by SIGTERM (marked `interrupted`, resumed
from DuckDB), a killed driver's runs recovered from their spools before resume looks, what a split topology
reserves, and the pre-flight refusal of demands no node can meet.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from qwen3lab.errors import SpecErrors
from qwen3lab.store import Store

from .conftest import REPO, tiny_config, vllm_processes as _descendants

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from qwen3lab.measure import events, executor, ray_executor  # noqa: E402

ENGINE = ('{model: builtin:qwen3-tiny, load_format: dummy, max_model_len: 1024, enforce_eager: true, '
          'env: {VLLM_CPU_KVCACHE_SPACE: "1"}}')


def experiment(tmp_path, name: str, workload: str, chapters: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\ngpu: cpu\nengine: {ENGINE}\nworkload: {workload}\nchapters:\n"
                    + textwrap.indent(textwrap.dedent(chapters), "  "))
    return path


# Fast health checks: a removed node is declared dead in about a second, not after 30 s. A patient wait for
# the dashboard agent, which a loaded machine starts slowly (the raylet gives up on it after 15 s by default).
HEAD = {"num_cpus": 1, "include_dashboard": False, "_system_config": {
    "health_check_period_ms": 500, "health_check_failure_threshold": 3, "agent_register_timeout_ms": 120_000}}


def start_node(c: Cluster, **args):
    """Ray waits a fixed 30 s for a new raylet to register; on a loaded machine that can run out. One retry,
    after ending by pid what the failed start left."""
    for attempt in (1, 2):
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        try:
            return c.add_node(**args)
        except Exception:
            if attempt == 2:
                raise
            for p in psutil.Process().children(recursive=True):
                if p.pid not in before:
                    p.kill()


@pytest.fixture(scope="module")
def cluster():
    # Ray's memory monitor killed the capacity test's trials as OutOfMemoryError late in a full suite (18 of
    # 23 GiB used, much of it orphaned vLLM engine processes, since stopped by engine.stop); the tiny servers
    # need little, and the kernel still guards memory.
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"
    c = Cluster()
    start_node(c, **HEAD)
    nodes = [start_node(c, num_cpus=1, resources={ray_executor.SLOT: 1}) for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield c, nodes
    ray.shutdown()
    c.shutdown()


def on_ray(path, db, **kw):
    """`qwen3lab run --executor ray` as a library call, on the fixture's cluster."""
    return ray_executor.execute(executor.plan(path, for_written_gpu=True), Store(db), **kw)


def vllm_processes() -> list:
    """vLLM servers under this test process (raylets are excluded: their --resources name the vllm_slot)."""
    return [p for p in _descendants() if "vllm.entrypoints" in " ".join(p.cmdline())]


def runs_of(db) -> list[dict]:
    df = Store(db).runs(with_json=True)
    return [] if df.empty else sorted(df.to_dict("records"), key=lambda r: str(r["started_at"]))


def wait_for_requests(db, timeout_s=600) -> dict:
    """The first run row that has stored requests, once it has some (read while the driver writes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(db):
            rows = runs_of(db)
            counts = Store(db).request_counts([r["run_id"] for r in rows]) if rows else {}
            for r in rows:
                if counts.get(r["run_id"], 0) > 0:
                    return r
        time.sleep(0.5)
    raise AssertionError("no requests were stored in time")


def gone(pids, timeout_s=60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                                              for p in pids):
        time.sleep(0.5)
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


def test_ray_rows_match_the_local_executor(cluster, tmp_path):
    path = experiment(tmp_path, "ray-same", "{num_requests: 12, mix: fixed-128, concurrency: 4, seed: 0}", """
        a:
          trials: [{name: seqs-8, engine.max_num_seqs: 8}]
        """)
    local_db, ray_db = str(tmp_path / "local.duckdb"), str(tmp_path / "ray.duckdb")
    local = executor.execute(executor.plan(path), Store(local_db), runs_dir=tmp_path / "runs-local")
    remote = on_ray(path, ray_db, runs_dir=tmp_path / "runs-ray")
    assert [r.status for r in local] == ["ok"]
    assert [(r.trial.name, r.status) for r in remote] == [("seqs-8", "ok")]

    here, there = Store(local_db), Store(ray_db)
    a_local, a_ray = local[0].run_id, remote[0].run_id
    left, right = here.requests([a_local], measured_only=False), there.requests([a_ray], measured_only=False)
    assert list(left.columns) == list(right.columns) and list(left.dtypes) == list(right.dtypes)
    assert len(left) == len(right) == 12 and list(left.status) == list(right.status)
    assert list(left.prompt_tokens) == list(right.prompt_tokens)  # same seeded workload, same tokens
    rl, rr = here.run(a_local), there.run(a_ray)
    for key in ("trial_key", "config_hash", "requests_digest", "tokenizer_fingerprint", "status", "completed",
                "vllm_version", "host", "cpu", "git_commit"):
        assert rl[key] == rr[key], key
    assert len(there.samples([a_ray])) > 0  # /metrics scrapes came back too
    # Provenance from the node that ran it: one of the two slot nodes, never the head.
    assert rr["info"]["ray"]["node_id"] in {n.node_id for n in cluster[1]}
    assert rr["info"]["machine"]["host"] == rr["host"]
    assert all(_spool_dropped_soon(tmp_path, r) for r in remote)  # stored, so the node let go of it
    # Resume: nothing runs again.
    again = on_ray(path, ray_db, runs_dir=tmp_path / "runs-ray")
    assert [r.reason for r in again] == ["already measured (resumed)"]
    assert vllm_processes() == []


def _spool_dropped_soon(tmp_path, result) -> bool:
    """The relay's spool and the run's own (kept on the node until the driver stored the run) are both gone."""
    spools = [tmp_path / "runs-ray" / result.run_id / name for name in ("relay.jsonl", "spool.jsonl")]
    deadline = time.monotonic() + 30
    while any(p.exists() for p in spools) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not any(p.exists() for p in spools)


def test_cluster_preflight_refuses_what_no_node_has(cluster, tmp_path):
    path = tmp_path / "h200.yaml"
    path.write_text(f"name: ray-h200\ngpu: h200\nengine: {ENGINE}\nworkload: {{num_requests: 4}}\n"
                    "chapters:\n  main:\n    trials: [{name: tp2, engine.tensor_parallel_size: 2}]\n")
    db = tmp_path / "never.duckdb"
    with pytest.raises(SpecErrors) as caught:
        on_ray(path, str(db), runs_dir=tmp_path / "runs")
    message = str(caught.value)
    assert "gpu = 'h200'" in message and "GPU types on this cluster: none" in message and "main/tp2" in message
    assert not db.exists()  # refused before anything ran or was stored


def test_cluster_errors_name_field_value_and_what_the_cluster_has():
    from qwen3lab.experiment.spec import Trial, Workload

    def trial(tp):
        return Trial(experiment="x", name=f"tp{tp}", engine={"kind": "vllm", "model": "builtin:qwen3-tiny", "tensor_parallel_size": tp},
                     workload=Workload(num_requests=1))

    h200 = {"Alive": True, "Resources": {"CPU": 32, "GPU": 2, "accelerator_type:H200": 1}}
    dead = {"Alive": False, "Resources": {"CPU": 32, "GPU": 8, "accelerator_type:H200": 1}}
    assert ray_executor.cluster_errors([trial(2)], "h200", [h200]) == []
    (err,) = ray_executor.cluster_errors([trial(4)], "h200", [h200, dead])
    assert err.field == "engine.tensor_parallel_size" and err.value == 4 and "at most 2 GPUs" in err.allowed
    (err,) = ray_executor.cluster_errors([trial(1), trial(1)], "a100-80g", [h200])
    assert err.field == "gpu" and "H200" in err.allowed and "and 1 more" in err.where
    (err,) = ray_executor.cluster_errors([trial(1)], "cpu", [h200])
    assert err.field == "executor" and ray_executor.SLOT in err.allowed


def test_a_split_trial_reserves_the_gpus_its_servers_use():
    from qwen3lab.experiment.spec import Trial, Workload

    def split(**topology):
        return Trial(experiment="x", name="split", workload=Workload(num_requests=1), engine={
            "kind": "vllm", "model": "builtin:qwen3-tiny", "topology": {"kind": "split", "threshold_tokens": 100,
                                                                          **topology}})

    assert ray_executor.gpus_needed(split(gpus=[0, 1])) == 2  # one GPU per server
    assert ray_executor.gpus_needed(split(gpus=[1, 1])) == 1  # both on one GPU
    assert ray_executor.gpus_needed(split()) == 1  # unset: they share the first
    wide = split(routes={"short": {}, "long": {"tensor_parallel_size": 2}})
    assert ray_executor.gpus_needed(wide) == 2  # sharing: as many as the larger route spans
    assert ray_executor.demand(split(gpus=[0, 1]), "h200")["GPU"] == 2
    one_gpu = {"Alive": True, "Resources": {"CPU": 8, "GPU": 1, "accelerator_type:H200": 1}}
    (err,) = ray_executor.cluster_errors([split(gpus=[0, 1])], "h200", [one_gpu])
    assert err.field == "engine.topology.gpus" and err.value == [0, 1] and "at most 1 distinct" in err.allowed


def test_a_node_keeps_the_runs_spool_until_the_driver_has_stored_it(tmp_path):
    """On a node the run's end goes to the relay, not DuckDB: its spool.jsonl (requests, samples, the end) stays
    for a killed driver's next start to ingest, until the driver drops it with the relay's. Here, with DuckDB as
    the store, the spool goes once the end is stored."""
    from qwen3lab.measure import ray_worker, runner
    from qwen3lab.spool import SPOOL_NAME, Spool
    from qwen3lab.store import finish_fields

    relay = ray_worker.Relay(tmp_path, {}, {"node_id": "n1"})
    run_id = relay.begin_run(trial_key="k")
    spool = Spool(tmp_path / run_id / SPOOL_NAME)
    runner._store_final(relay, spool, run_id, finish_fields("ok"), [], log=lambda _: None)
    assert spool.read().finish["status"] == "ok"
    assert ray_worker.drop_spool(str(tmp_path), [run_id]) == 2 and list((tmp_path / run_id).iterdir()) == []
    store = Store(str(tmp_path / "here.duckdb"))
    here = store.begin_run(trial_key="k")
    spool = Spool(tmp_path / here / SPOOL_NAME)
    runner._store_final(store, spool, here, finish_fields("ok"), [], log=lambda _: None)
    assert not spool.path.exists() and store.run(here)["status"] == "ok"


def test_driver_sigterm_marks_interrupted_then_resumes(cluster, tmp_path):
    c, _ = cluster
    path = experiment(tmp_path, "ray-sigterm", "{num_requests: 40, mix: fixed-128, concurrency: 2, request_rate: 4}", """
        main:
          trials: [{name: paced}]
        """)
    db = str(tmp_path / "term.duckdb")
    driver = subprocess.Popen([sys.executable, "-m", "qwen3lab.cli", "run", str(path), "--db", db, "--executor", "ray",
                               "--address", c.address, "--runs-dir", str(tmp_path / "runs")], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_requests(db)
        servers = [p.pid for p in vllm_processes()]
        driver.send_signal(signal.SIGTERM)
        out, _ = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode != 0, out
    (row,) = runs_of(db)
    assert row["status"] == "interrupted", (row["status"], out)
    assert 0 < Store(db).request_counts([row["run_id"]])[row["run_id"]] < 40
    assert gone(servers), "the cancelled trial's vLLM server was left running"

    (result,) = on_ray(path, db, runs_dir=tmp_path / "runs")
    assert result.status == "ok"
    assert [r["status"] for r in runs_of(db)] == ["interrupted", "ok"]


def test_a_killed_drivers_runs_are_recovered_before_resume_looks(cluster, tmp_path):
    """A driver SIGKILLed takes its workers along and leaves their runs `running` (no handler ran). The next
    Ray start recovers them as the local executor does, before it looks for finished trials: a run that ended
    on its node but whose end never reached DuckDB is finished from the spool its node kept (and not run
    again); one cut mid-load is `interrupted` with what its spool holds. No server starts."""
    from qwen3lab.measure.loadgen import RequestRecord
    from qwen3lab.spool import SPOOL_NAME, Spool
    from qwen3lab.store import Owner, finish_fields, new_run_id, now, record_row

    path = experiment(tmp_path, "ray-killed", "{num_requests: 3, mix: fixed-128, seed: 0}", """
        main:
          trials: [{name: ended}]
        other:
          trials: [{name: cut}]
        """)
    trials = {t.name: t for t in executor.plan(path, for_written_gpu=True).trials}
    # The Ray worker that held the runs: a process of this host, gone now, as the killed driver's workers are.
    worker = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    owner = Owner(worker.pid, Owner.me().host, psutil.Process(worker.pid).create_time())
    worker.communicate()
    db = str(tmp_path / "killed.duckdb")
    store, runs = Store(db), {}
    for name, ended in (("ended", True), ("cut", False)):
        t, run_id = trials[name], new_run_id()
        rows = []
        for i in range(3):
            r = RequestRecord(i, "fixed", 128, 128, False, False, sent_at=0.1 * i, ttft=0.05, e2el=0.5,
                              chunk_times=[0.05, 0.5], prompt_tokens=128, output_tokens=128)
            rows.append(record_row(r))
        spool = Spool(tmp_path / "runs" / run_id / SPOOL_NAME)
        spool.add_requests(rows)
        if ended:
            spool.finish(finish_fields("ok", None, {"completed": 3}))
        store.begin_run(run_id=run_id, trial_key=t.key, experiment=t.experiment, chapter=t.chapter, trial=t.name,
                        engine_kind="vllm", model=t.engine.model, config_hash=t.engine.config_hash(),
                        spool_path=str(spool.path), heartbeat_at=now(), info_json={"ray": {"node_id": "n1"}},
                        **owner.fields())
        store.add_requests(run_id, rows[:1])  # what had reached the driver before it was killed
        runs[name] = run_id

    lines = []
    results = ray_executor.execute(executor.plan(path, only=["main"], for_written_gpu=True), Store(db),
                                   runs_dir=tmp_path / "runs", listener=events.Listener(lines.append))
    assert [(r.trial.name, r.run_id, r.reason) for r in results] == [
        ("ended", runs["ended"], "already measured (resumed)")], lines
    ended, cut = store.run(runs["ended"]), store.run(runs["cut"])
    assert ended["status"] == "ok" and cut["status"] == "interrupted"
    assert f"pid {worker.pid}" in cut["reason"] and "stopped without finishing" in cut["reason"]
    assert store.request_counts(list(runs.values())) == {runs["ended"]: 3, runs["cut"]: 3}  # none twice
    assert sum("recovered run" in line for line in lines) == 2, lines
    assert len(store.runs()) == 2 and vllm_processes() == []


def test_search_asks_as_many_trials_as_free_slots_and_tells_each_result(cluster, tmp_path):
    """Endpoint trials against one running server (stopped at the end: one server at a time), so the search
    launches nothing itself."""
    from qwen3lab.measure import engine

    with engine.launch(tiny_config(max_model_len=1024), tmp_path / "server.log", ready_timeout_s=600) as server:
        _search(server, tmp_path)


def _search(tiny_server, tmp_path):
    import yaml

    from qwen3lab.experiment import files as xp
    from qwen3lab.measure import search as se
    from qwen3lab.models import resolve_model_path

    path = tmp_path / "ray-search.yaml"
    path.write_text(yaml.safe_dump({
        "name": "ray-search", "gpu": "cpu",
        "engine": {"kind": "endpoint", "url": tiny_server.base_url, "model": tiny_server.model_name,
                   "tokenizer": str(resolve_model_path("builtin:qwen3-tiny"))},
        "workload": {"num_requests": 8, "mix": "fixed-128", "concurrency": 1},
        "slo": {"ttft_ms": 10000},
        "search": {"space": {"workload.concurrency": {"low": 1, "high": 4}, "workload.seed": {"low": 0, "high": 99}},
                   "objective": "goodput", "sampler": "random", "seed": 0, "budget": {"trials": 5}}}))
    exp = xp.load(path)
    slots = ray_executor.free_slots(ray, xp.trial_from(exp, exp.search.chapter, {}), "cpu")
    assert slots == 3  # one CPU on each of the three nodes: an endpoint trial needs only its load generator
    db = str(tmp_path / "search.duckdb")
    result = se.run_search(str(path), db, str(tmp_path / "runs"), executor="ray")
    assert [t.state for t in result.history] == ["complete"] * 5, [(t.state, t.reason) for t in result.history]
    stored = Store(db)
    for t in result.history:  # told what was stored
        assert t.value == stored.run(t.run_id)["request_goodput"]
    rows = stored.search_trials(result.study)
    assert list(rows.state) == ["complete"] * 5 and rows.run_id.nunique() == 5
    assert result.best.value == max(t.value for t in result.history)
    # In flight together, never more than the free slots: from the stored start and end times.
    spans = [(r["started_at"], r["ended_at"]) for r in runs_of(db)]
    most = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert 2 <= most <= slots, spans
    again = se.run_search(str(path), db, str(tmp_path / "runs"), executor="ray")  # resumed: budget spent
    assert len(stored.runs()) == 5 and again.stopped == "budget of 5 trials spent"


def test_cli_refuses_what_the_ray_executor_cannot_honour(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "qwen3lab.cli", *args], capture_output=True, text=True,
                              cwd=REPO, timeout=300)

    exp = str(REPO / "experiments" / "cpu-tiny.yaml")
    got = cli("sweep", exp, "--executor", "ray", "-p", "num_requests=8", "--db", str(tmp_path / "x.duckdb"))
    assert got.returncode == 2 and "-p num_requests changes the trials" in got.stderr
    got = cli("run", exp, "--address", "auto", "--db", str(tmp_path / "x.duckdb"))
    assert got.returncode == 2 and "--address needs --executor ray" in got.stderr
    got = cli("run", exp, "--executor", "dask", "--db", str(tmp_path / "x.duckdb"))
    assert got.returncode == 2 and "not one of local, ray" in got.stderr
    assert not (tmp_path / "x.duckdb").exists()


def test_sweep_on_ray_measures_on_the_cluster_then_the_notebooks_find_the_runs(cluster, tiny_server, tmp_path):
    """`qwen3lab sweep --executor ray`, the command a user types: the chapter's trials run as Ray tasks (two
    endpoint trials against the session's server, `repeats: 2`: two launches each, as the local executor
    makes them), then the chapter notebook, executed by papermill, finds them stored and runs nothing again;
    the report notebook follows."""
    from qwen3lab.models import resolve_model_path

    c, nodes = cluster
    tokenizer = resolve_model_path("builtin:qwen3-tiny")
    path = tmp_path / "ray-sweep.yaml"
    path.write_text(f"name: ray-sweep\ngpu: cpu\n"
                    f"engine: {{kind: endpoint, url: '{tiny_server.base_url}', model: '{tiny_server.model_name}', "
                    f"tokenizer: '{tokenizer}'}}\n"
                    "workload: {num_requests: 6, warmup_requests: 0, mix: fixed-128, concurrency: 2}\n"
                    "chapters:\n  baseline:\n    repeats: 2\n"
                    "    trials: [{name: a, workload.seed: 1}, {name: b, workload.seed: 2}]\n")
    db, runs = tmp_path / "sweep.duckdb", tmp_path / "runs"
    got = subprocess.run([sys.executable, "-m", "qwen3lab.cli", "sweep", str(path), "--only", "baseline", "--db",
                          str(db), "--runs-dir", str(runs), "--executor", "ray", "--address", c.address],
                         capture_output=True, text=True, cwd=REPO, timeout=900)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    rows = runs_of(db)
    assert sorted((r["trial"], r["status"]) for r in rows) == [("a", "ok")] * 2 + [("b", "ok")] * 2, rows
    told = re.findall(r"^ +ok baseline/(a|b): on .* \(run ", got.stdout, re.M)  # each launch, as it ended
    assert sorted(told) == ["a", "a", "b", "b"], got.stdout[-3000:]
    # measured on the cluster's nodes (an endpoint trial reserves a CPU, not a slot: the head may take one)
    nodes_used = {Store(db).run(r["run_id"])["info"]["ray"]["node_id"] for r in rows}
    assert nodes_used <= {n.node_id for n in [c.head_node, *nodes]}
    assert Store(db).request_counts([r["run_id"] for r in rows]) == {r["run_id"]: 6 for r in rows}
    (executed,) = runs.glob("ray-sweep/*/10_baseline.ipynb")
    text = executed.read_text()
    assert "not run again" in text and '"output_type": "error"' not in text
    assert next(runs.glob("ray-sweep/*/99_report.ipynb")).is_file()


def test_capacity_searches_run_as_tasks_one_server_each_and_resume(cluster, tmp_path):
    """`qwen3lab capacity --executor ray`: each configuration's search is one task, its points runs of one server
    on one node, its row and every point stored by the driver; both searches at once on the two slot nodes."""
    path = experiment(tmp_path, "ray-capacity", "{num_requests: 6, mix: fixed-128, capacity: {axis: concurrency, "
                      "start: 1, max_points: 3, tolerance: 0.5, requests_per_point: 6, warmup_per_point: 1, "
                      "min_arrival_s: 4, arrival_lifetimes: 2, ramp_lifetimes: 0.5}}", """
        main:
          trials: [{name: seqs-2, engine.max_num_seqs: 2}, {name: seqs-8, engine.max_num_seqs: 8}]
        """)
    db = str(tmp_path / "cap.duckdb")
    from qwen3lab.measure import capacity as cap

    results = ray_executor.run_capacities(path, db, runs_dir=tmp_path / "runs")
    assert [r.trial.name for r in results] == ["seqs-2", "seqs-8"]
    store = Store(db)
    nodes = set()
    for r in results:
        assert r.status in cap.SEARCH_DONE and len(r.points) >= 2, (r.status, r.reason)
        (row,) = store.capacities(trial_key=r.trial.key).to_dict("records")
        assert row["points"] == len(r.points) and row["server_starts"] == 1 and row["search_id"] == r.search_id
        points = store.capacity_points([r.search_id])
        assert list(points.point_index) == list(range(len(r.points))) and (points.completed > 0).all()
        infos = [store.run(run_id)["info"]["ray"]["node_id"] for run_id in points.run_id]
        assert len(set(infos)) == 1  # every point on the node whose server it was
        nodes |= set(infos)
        assert open(points.log_path.iloc[0]).read().count("# qwen3lab exec:") == 1  # one launch for all points
    assert nodes <= {n.node_id for n in cluster[1]}
    again = ray_executor.run_capacities(path, db, runs_dir=tmp_path / "runs")
    assert [r.search_id for r in again] == [r.search_id for r in results]  # resumed: nothing measured again
    assert len(store.capacities()) == 2 and vllm_processes() == []


def test_node_lost_mid_trial_is_stored_lost_and_retried_elsewhere(cluster, tmp_path):
    c, nodes = cluster
    # Paced arrivals keep the load running ~10 s, long enough to lose its node in the middle.
    path = experiment(tmp_path, "ray-lost", "{num_requests: 40, mix: fixed-128, concurrency: 2, request_rate: 4}", """
        main:
          trials: [{name: paced}]
        """)
    db = str(tmp_path / "lost.duckdb")
    results, failure = [], []

    def drive():
        try:
            results.extend(on_ray(path, db, runs_dir=tmp_path / "runs"))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            failure.append(exc)

    driver = threading.Thread(target=drive)
    driver.start()
    first = wait_for_requests(db)
    victim_id = json.loads(first["info_json"])["ray"]["node_id"]
    victim = next(n for n in nodes if n.node_id == victim_id)
    servers = [p.pid for p in vllm_processes()]
    c.remove_node(victim, allow_graceful=False)  # abrupt, as a node that fails
    driver.join(timeout=900)
    assert not driver.is_alive() and not failure, failure
    try:
        rows = runs_of(db)
        assert [r["status"] for r in rows] == ["lost", "ok"], [(r["status"], r["reason"]) for r in rows]
        lost, ok = rows
        assert "lost mid-trial" in lost["reason"] and "retried on another node" in lost["reason"]
        partial = Store(db).request_counts([lost["run_id"]]).get(lost["run_id"], 0)
        assert 0 < partial < 40  # what arrived before the node went is kept
        assert Store(db).request_counts([ok["run_id"]])[ok["run_id"]] == 40
        assert json.loads(ok["info_json"])["ray"]["node_id"] != victim_id
        assert [r.status for r in results] == ["ok"]
        assert gone(servers), "the lost node's vLLM server outlived its worker"
    finally:
        nodes.remove(victim)  # the module's last test: the cluster is not made whole again
