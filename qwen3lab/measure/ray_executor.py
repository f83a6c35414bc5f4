"""The Ray executor: an experiment's trials as Ray tasks on a cluster, every row stored in one DuckDB.

Each trial is one task that reserves what its server needs: `num_gpus` = tensor x pipeline parallel size on
nodes of the experiment's GPU type (Ray's accelerator type), or one `vllm_slot` (a custom resource) on CPU-only
clusters. The task runs runner.run_trial on its node (ray_worker) and streams its writes back in batches; this
driver alone writes DuckDB. Faults: a node or worker lost mid-trial leaves its run stored as `lost` with the
rows that arrived, and the trial is tried again on another node (MAX_ATTEMPTS in all); a driver stopped by
SIGTERM or Ctrl-C marks its runs `interrupted`, and running it again resumes from DuckDB; a driver killed
(SIGKILL) leaves them `running`, and its next start recovers them as the local executor does (executor.recover;
ray_worker says from what). A trial that needs resources no node has is a pre-flight error before anything
runs. Which launches run (resume, `repeats` interleaved, `repeats: auto`, limits) is measure/schedule.py's, as
for the local executor: this module only places them. `qwen3lab capacity --executor ray` runs each trial's
capacity search as one such task (run_capacities).
"""
from __future__ import annotations

import functools
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwen3lab import campaign
from qwen3lab.errors import MissingDependency, Qwen3LabError, SpecError, SpecErrors
from qwen3lab.experiment.spec import Trial
from qwen3lab.measure import executor, provenance, runner
from qwen3lab.measure.events import Listener
from qwen3lab.measure.schedule import Schedule
from qwen3lab.store import Store

SLOT = "vllm_slot"
MAX_ATTEMPTS = 3  # a trial whose node is lost runs at most this many times in all
RAY_HINT = "pip install 'ray[default]' (the same version on every node)"


class ClusterError(Qwen3LabError):
    pass


def _ray():
    try:
        import ray
    except ImportError as exc:
        raise MissingDependency("ray", RAY_HINT) from exc
    return ray


def accelerator_type(gpu_id: str) -> str:
    """Ray's accelerator type for a catalogue GPU, named by Ray's own rule for the NVML name it reports."""
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

    from qwen3lab.hardware import catalogue

    return NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(catalogue.get_gpu(gpu_id).name)


def gpus_needed(trial: Trial) -> int:
    """The GPUs one trial's server(s) hold: tensor x pipeline parallel size; for a split topology, one per
    distinct topology.gpus entry (each server gets that one GPU), or, sharing one, its larger route's size."""
    cfg = trial.engine
    split = getattr(cfg, "topology", None)
    if split is None:
        return _parallel_size(cfg)
    if split.gpus:
        return len(set(split.gpus))
    return max(_parallel_size(route) for route in cfg.route_engines().values())


def _parallel_size(cfg) -> int:
    tp = getattr(cfg, "tensor_parallel_size", None) or 1
    args, pp = list(getattr(cfg, "extra_args", [])), 1
    for i, arg in enumerate(args):
        if arg.startswith("--pipeline-parallel-size="):
            pp = int(arg.split("=", 1)[1])
        elif arg in ("--pipeline-parallel-size", "-pp") and i + 1 < len(args):
            pp = int(args[i + 1])
    return tp * pp


def demand(trial: Trial, gpu_id: str | None) -> dict[str, float]:
    """The Ray resources one trial's task reserves on its node."""
    if trial.engine.kind == "endpoint":
        return {"CPU": 1}  # the server runs elsewhere: the task is only the load generator
    if not gpu_id or gpu_id == "cpu":
        return {SLOT: 1}
    return {"GPU": gpus_needed(trial), f"accelerator_type:{accelerator_type(gpu_id)}": 0.001}


def task_options(need: dict[str, float]) -> dict[str, Any]:
    opts: dict[str, Any] = {"num_cpus": need.get("CPU", 0), "resources": {}}
    for key, amount in need.items():
        if key == "GPU":
            opts["num_gpus"] = amount
        elif key != "CPU":
            opts["resources"][key] = amount
    return opts


def cluster_errors(trials: list[Trial], gpu_id: str | None, nodes: list[dict]) -> list[SpecError]:
    """One error per kind of demand that no alive node can meet, naming the trials and what the cluster has."""
    alive = [n for n in nodes if n.get("Alive")]
    by_need: dict[tuple, list[Trial]] = {}
    for trial in trials:  # a split topology's GPUs are its topology.gpus: its error names them, not tp
        split = getattr(trial.engine, "topology", None) is not None and bool(trial.engine.topology.gpus)
        by_need.setdefault((tuple(sorted(demand(trial, gpu_id).items())), split), []).append(trial)
    errors = []
    for (need, split), group in by_need.items():
        if any(all(n["Resources"].get(k, 0) >= v for k, v in need) for n in alive):
            continue
        where = f"{group[0].chapter}/{group[0].name}" + (f" and {len(group) - 1} more" if len(group) > 1 else "")
        wanted = dict(need)
        types = sorted({k.split(":", 1)[1] for n in alive for k in n["Resources"] if k.startswith("accelerator_type:")})
        if SLOT in wanted:
            errors.append(SpecError("executor", "ray", f"a cluster with a `{SLOT}` resource on some node (these "
                                    f"{len(alive)} nodes have none)", f"start CPU nodes with ray start --resources="
                                    f"'{{\"{SLOT}\": 1}}' (one per server that fits the node)", where))
        elif "GPU" in wanted:
            typed = [n for n in alive if all(n["Resources"].get(k, 0) >= v for k, v in need if k != "GPU")]
            if not typed:
                errors.append(SpecError("gpu", gpu_id, f"GPU types on this cluster: {', '.join(types) or 'none'}",
                                        "add nodes with that GPU or set the experiment's gpu: to one the cluster "
                                        "has", where))
            else:
                most = int(max(n["Resources"].get("GPU", 0) for n in typed))
                errors.append(SpecError("engine.topology.gpus", list(group[0].engine.topology.gpus),
                                        f"at most {most} distinct GPUs (one per server) on one node of this type",
                                        "let both servers share one GPU (gpus: [0, 0]) or add larger nodes", where)
                              if split else
                              SpecError("engine.tensor_parallel_size", int(wanted["GPU"]),
                                        f"at most {most} GPUs (tensor x pipeline parallel) on one node of this type",
                                        "lower tensor_parallel_size (or pipeline parallel size) or add larger "
                                        "nodes", where))
        else:
            errors.append(SpecError("executor", "ray", f"a node with {wanted}", "add a node that has it", where))
    return errors


def connect(address: str | None):
    """Join a cluster (`auto`, `ray://HOST:10001`, HOST:PORT) or start a one-node Ray here with one vllm_slot."""
    ray = _ray()
    if ray.is_initialized():
        return ray
    try:
        if address:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        else:
            ray.init(resources={SLOT: 1}, log_to_driver=False, configure_logging=False, include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"cannot reach the Ray cluster at {address!r}: {exc}. Fix: start it (ray start --head) "
                           "or pass --address auto / ray://HOST:10001") from exc
    return ray


@dataclass
class Flight:
    """One attempt of one trial on the cluster, as the driver follows it."""

    trial: Trial
    attempt: int
    gen: Any
    excluded: tuple[str, ...] = ()  # nodes lost under earlier attempts
    run_id: str | None = None  # the newest run (a capacity search has one per load point)
    node: dict = field(default_factory=dict)
    requests: int = 0
    tag: Any = None  # the caller's handle (a search's optuna trial), kept across attempts
    kind: str = "trial"  # or "capacity"/"capacity_launch": capacity searches, their points runs of one server
    run_ids: list[str] = field(default_factory=list)
    search_id: str | None = None


def replay(store: Store, event: tuple, flight: Flight) -> dict | None:
    """Store one event a worker relayed; returns the trial's outcome for its last event."""
    kind, run_id, payload = event
    if kind in ("begin_run", "begin_capacity"):  # a node's process is in no campaign: the driver's is theirs
        payload["campaign_id"] = payload.get("campaign_id") or campaign.current()
    if kind == "begin_run":
        store.begin_run(run_id=run_id, **payload)
        flight.run_id, flight.node = run_id, payload["info_json"]["ray"]
        flight.run_ids.append(run_id)
    elif kind == "begin_capacity":
        store.begin_capacity(search_id=run_id, **payload)
        flight.search_id = run_id
    elif kind == "finish_capacity":
        store.finish_capacity(run_id, payload.pop("status"), payload.pop("reason"), **payload)
    elif kind == "update_run":
        store.update_run(run_id, **payload)
    elif kind == "finish_run":
        ended = payload.pop("ended_at")
        store.finish_run(run_id, payload.pop("status"), payload.pop("reason"), payload.pop("summary"), **payload)
        store.update_run(run_id, ended_at=ended)  # the node's time, not the time it arrived here
    elif kind == "add_requests":
        store.add_requests(run_id, payload)
        flight.requests += sum(not r["warmup"] for r in payload)
    elif kind == "add_samples":
        store.add_samples(run_id, [tuple(s) for s in payload])
    elif kind == "result":
        return payload
    return None


def _refused_on_node(store: Store, flight: Flight, outcome: dict) -> str:
    """A trial the node's own pre-flight refused (or that raised) before its run row: stored as failed."""
    t = flight.trial
    run_id = store.begin_run(trial_key=t.key, experiment=t.experiment, chapter=t.chapter, trial=t.name,
                             baseline=t.baseline, engine_kind=t.engine.kind, model=t.engine.model,
                             config_hash=t.engine.config_hash(), status="failed", reason=outcome["reason"])
    store.finish_run(run_id, "failed", outcome["reason"])
    return run_id


def execute(planned, store: Store, address: str | None = None, runs_dir: str | Path = "runs",
            retry_failed: bool = False, fresh: bool = False, listener: Listener | None = None,
            max_attempts: int = MAX_ATTEMPTS, max_trials: int | None = None) -> list[runner.TrialResult]:
    """executor.execute on a Ray cluster: the same schedule (resume, repeats interleaved, repeats: auto,
    max_trials), each launch a task, as many at once as the cluster has room for (plan it with
    for_written_gpu=True: the trials run on the nodes, not here); the cluster's fit is checked first."""
    planned.raise_errors()
    listener = listener or Listener()
    ray = _checked(planned, address)
    sched = Schedule(planned, store, executor.auto_launch, retry_failed, fresh, max_trials, listener)
    with TrialPool(ray, store, job_for(planned.experiment.gpu, runs_dir, planned.path), listener,
                   max_attempts) as pool:
        while True:
            while (launch := sched.next()) is not None:
                listener.launching(launch.trial, f"on the cluster{launch.label}", executor.expected_requests(launch.trial))
                pool.submit(launch.trial, tag=launch)
            if not pool:
                break
            for launch, result in pool.step():
                listener.finished(launch.trial, result.status, executor.told(result))
                sched.finished(launch, result)
    order = {t.key: i for i, t in enumerate(planned.trials)}
    return sorted(sched.results, key=lambda r: order[r.trial.key])


def _checked(planned, address: str | None):
    """Ray, joined, once every trial's demand fits some node of the cluster."""
    ray = connect(address)
    errors = cluster_errors(planned.trials, planned.experiment.gpu, ray.nodes())
    if errors:
        raise SpecErrors(errors)
    return ray


def run_capacities(path: str | Path, db: str, only: list[str] | None = None, runs_dir: str | Path = "runs",
                   fresh: bool = False, listener: Listener | None = None, address: str | None = None,
                   max_attempts: int = MAX_ATTEMPTS) -> list:
    """capacity.run_capacities on a Ray cluster: the same schedule (capacity.SEARCHES), each capacity launch a task
    (one server on one node for all of its points), as many at once as the cluster has slots; resumes from DuckDB."""
    from qwen3lab.measure import capacity as cap

    listener = listener or Listener()
    planned = executor.plan(path, only, for_written_gpu=True)
    planned.raise_errors()
    store = Store(db)
    ray = _checked(planned, address)
    failed: set[str] = set()  # a launch that did not finish ends its trial: no more servers for it
    sched = Schedule(planned, store, lambda *_: None, fresh=fresh, listener=listener, kind=cap.SEARCHES)
    with TrialPool(ray, store, job_for(planned.experiment.gpu, runs_dir, planned.path), listener,
                   max_attempts) as pool:
        while True:
            while (launch := sched.next()) is not None:
                if launch.trial.key in failed:
                    sched.finished(launch, runner.TrialResult(launch.trial, "", "skipped", "an earlier launch failed"))
                    continue
                listener.launching(launch.trial, f"its capacity search on the cluster{launch.label}")
                pool.submit(launch.trial, tag=launch, kind="capacity_launch")
            if not pool:
                break
            for launch, result in pool.step():
                if result.status not in cap.SEARCH_DONE + ("skipped",):
                    failed.add(launch.trial.key)
                listener.finished(launch.trial, result.status, result.reason or "")
                sched.finished(launch, result)
    # each trial's launches combined, or the one that did not finish (a search lost before its row began: none)
    results = [cap.stored_capacity(store, t, "measured on the cluster", unfinished=True) for t in planned.trials]
    return [r for r in results if r is not None]


def job_for(gpu_id: str | None, runs_dir: str | Path, experiment_path: str | Path | None) -> dict:
    """What every trial task of one experiment is given beside its trial."""
    return {"gpu_id": gpu_id, "runs_dir": str(Path(runs_dir).resolve()),
            "experiment_path": str(experiment_path) if experiment_path else None,
            # what only the driver knows: the experiment file's commit, and OMP_NUM_THREADS as the user set it
            "overrides": {"git_commit": provenance.git_commit(str(experiment_path) if experiment_path else None)},
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


@functools.cache
def _remote_trial():
    """The trial task, registered with Ray once per driver (each submission then ships only its arguments)."""
    from qwen3lab.measure import ray_worker

    return _ray().remote(num_returns="streaming", max_retries=0)(ray_worker.trial_events)


def _submit(trial: Trial, job: dict, attempt: int, excluded: tuple[str, ...] = (), kind: str = "trial") -> Any:
    opts = task_options(demand(trial, job["gpu_id"]))
    if excluded:  # retried elsewhere: never on a node this trial was lost on
        opts["label_selector"] = {"ray.io/node-id": f"!in({','.join(excluded)})"}
    return _remote_trial().options(**opts).remote(
        trial.model_dump(mode="json"), job["runs_dir"], job["experiment_path"], job["overrides"], job["gpu_id"],
        attempt, job["omp_num_threads"], kind)


class TrialPool:
    """The trials in flight on the cluster: submit them, then step() until each has an outcome. Lost attempts
    are stored and tried again here; leaving the pool by SIGTERM or Ctrl-C marks its runs interrupted. What
    happens reaches the caller through an events.Listener (trials overlap: it is told per trial); each
    trial's end is the caller's to tell, once it knows what it was (a launch, a capacity search, a suggestion)."""

    def __init__(self, ray, store: Store, job: dict, listener, max_attempts: int = MAX_ATTEMPTS):
        self.ray, self.store, self.job, self.listener, self.max_attempts = ray, store, job, listener, max_attempts
        self.flights: list[Flight] = []

    def __len__(self) -> int:
        return len(self.flights)

    def submit(self, trial: Trial, tag: Any = None, kind: str = "trial") -> None:
        self.flights.append(Flight(trial, 1, _submit(trial, self.job, 1, kind=kind), tag=tag, kind=kind))

    def step(self, timeout_s: float = 1.0) -> list[tuple[Any, runner.TrialResult]]:
        """Store what arrived within timeout_s; (tag, result) of each trial that ended."""
        ray, done = self.ray, []
        ready, _ = ray.wait([f.gen for f in self.flights], num_returns=1, timeout=timeout_s)
        for flight in [f for f in self.flights if any(f.gen is g for g in ready)]:
            try:
                events = ray.get(next(flight.gen))
            except StopIteration:
                self.flights.remove(flight)
                continue
            except ray.exceptions.RayTaskError as exc:  # the task's own code failed: a bug, reported
                self.flights.remove(flight)
                done.append((flight.tag, self._finish(flight, {"status": "error", "reason": f"task error: {exc.cause!r}"})))
                continue
            except ray.exceptions.RayError as exc:  # the worker or its node is gone
                self.flights.remove(flight)
                retry = self._lost(flight, exc)
                if retry is None:
                    done.append((flight.tag, runner.TrialResult(flight.trial, flight.run_id or "", "lost",
                                                                "lost; no attempts left")))
                else:
                    self.flights.append(retry)
                continue
            before = flight.requests
            outcome = None
            for event in events:
                outcome = replay(self.store, event, flight) or outcome
            if flight.requests > before:
                self.listener.requests_done(flight.trial, flight.requests - before)
            if outcome is not None:
                done.append((flight.tag, self._finish(flight, outcome)))
                if flight.node.get("node_id"):
                    _drop_spool(ray, self.job["runs_dir"], flight)
        return done

    def _finish(self, flight: Flight, outcome: dict) -> runner.TrialResult:
        status, reason = outcome.get("status", "failed"), outcome.get("reason")
        if status == "error" and flight.kind.startswith("capacity"):  # the search's row says it; no run row stands for it
            status = "failed"
            if flight.search_id is None:
                t = flight.trial
                flight.search_id = self.store.begin_capacity(trial_key=t.key, experiment=t.experiment,
                                                             chapter=t.chapter, trial=t.name,
                                                             campaign_id=campaign.current())
            self.store.finish_capacity(flight.search_id, "failed", reason)
        elif status == "error":  # raised on the node: stored as failed, with a row of its own if it had none
            status = "failed"
            if flight.run_id is None:
                flight.run_id = _refused_on_node(self.store, flight, outcome)
            self.store.finish_run(flight.run_id, "failed", reason)
        where = f"on {flight.node['node_ip']}" if flight.node.get("node_ip") else None
        return runner.TrialResult(flight.trial, flight.run_id or "", status,
                                  f"{reason} ({where})" if reason and where else reason or where)

    def _lost(self, flight: Flight, exc) -> Flight | None:
        """Store a lost attempt with what arrived of it; the next attempt, submitted, or None when none is left."""
        node_id = flight.node.get("node_id")
        excluded = flight.excluded + ((node_id,) if node_id else ())
        need = demand(flight.trial, self.job["gpu_id"])
        elsewhere = [n for n in self.ray.nodes() if n.get("Alive") and n["NodeID"] not in excluded
                     and all(n["Resources"].get(k, 0) >= v for k, v in need.items())]
        again = flight.attempt < self.max_attempts and bool(elsewhere)
        why = (f"worker or node {flight.node.get('node_ip', '?')} lost mid-trial ({type(exc).__name__}); "
               f"{flight.requests} requests stored; attempt {flight.attempt} of {self.max_attempts}, "
               + ("retried on another node" if again else "no other node can run it" if not elsewhere
                  else "no retries left"))
        if flight.run_id:
            self.store.finish_run(flight.run_id, "lost", why)
        if flight.search_id:  # a capacity search lost with its node: the retry is a search of its own
            self.store.finish_capacity(flight.search_id, "lost", why)
        self.listener.log(f"{'lost':>8} {flight.trial.chapter}/{flight.trial.name}: {why}")
        if not again:
            return None
        gen = _submit(flight.trial, self.job, flight.attempt + 1, excluded, flight.kind)
        return Flight(flight.trial, flight.attempt + 1, gen, excluded, tag=flight.tag, kind=flight.kind)

    def __enter__(self):
        self._previous = _on_sigterm()
        return self

    def __exit__(self, kind, exc, tb):
        _restore(self._previous)
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            for flight in self.flights:
                why = "the driver was stopped (SIGTERM or Ctrl-C); run the same command again to resume"
                if flight.run_id:
                    self.store.finish_run(flight.run_id, "interrupted", why)
                if flight.search_id:
                    self.store.finish_capacity(flight.search_id, "interrupted", why)
                # The worker goes, and its server with it (a server dies with the thread that started it).
                self.ray.cancel(flight.gen, force=True)
        return False


def free_slots(ray, trial: Trial, gpu_id: str | None) -> int:
    """How many tasks like this trial's the alive nodes can run at once."""
    need = demand(trial, gpu_id)
    return sum(min(int(n["Resources"].get(k, 0) // v) for k, v in need.items())
               for n in ray.nodes() if n.get("Alive"))


def _drop_spool(ray, runs_dir: str, flight: Flight) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from qwen3lab.measure import ray_worker

    strategy = NodeAffinitySchedulingStrategy(flight.node["node_id"], soft=False)
    ray.remote(num_cpus=0, max_retries=0)(ray_worker.drop_spool).options(scheduling_strategy=strategy).remote(
        runs_dir, flight.run_ids)  # not waited for: a node gone since keeps its spools, nothing is lost


def _on_sigterm():
    """SIGTERM becomes KeyboardInterrupt, so a stopped driver marks its runs and cancels its tasks."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)


def _restore(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
