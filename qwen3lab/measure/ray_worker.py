"""The worker half of the Ray executor: one trial run on a cluster node, its writes relayed to the driver.

The per-trial function (runner.run_trial) runs unchanged on the node; the store it is given is a Relay that
turns each write into an event. Events are appended to a spool file on the node first, then handed to the
driver in batches by a streaming generator task; the driver replays them into DuckDB (only the driver writes
DuckDB) and deletes the spools once the run's last event is stored. A driver that dies leaves the spools on the
node, so what was measured is still there: the run's own spool.jsonl (requests, samples, its end) is kept
until then too, and is what Store.recover ingests when the driver's next start finds the run `running` with
its worker gone. That read happens on the driver's host: it reaches a node's spool only when the node is that
host (or shares runs_dir with it); elsewhere the run is marked `interrupted` with the rows that had arrived.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from qwen3lab.spool import SPOOL_NAME
from qwen3lab.store import REQUEST_COLUMNS, Claim, Owner, new_run_id, now, record_row

BATCH_S = 2.0  # how often a running trial hands its rows to the driver
RELAY_NAME = "relay.jsonl"  # every event, beside the runner's own spool.jsonl of the run


class Relay:
    """The RunSink (sink.py) of a run on a Ray node: every call becomes an event the driver replays into its
    Store."""

    flush_every_s = BATCH_S  # an event is a list append: rows go to the driver during the load, not after it
    keeps_spool = True  # a write here is in DuckDB only once the driver replays it: the run keeps its spool

    def __init__(self, runs_dir: Path, overrides: dict[str, Any], node: dict[str, Any]):
        self.runs_dir, self.overrides, self.node = runs_dir, overrides, node
        self.events: list[tuple] = []
        self.rows: dict[str, list[dict]] = {}  # what this node relayed, for run_trial's end-of-run summary
        self.relayed_samples: dict[str, list[tuple]] = {}  # and for a capacity point's queue trend
        self.lock = threading.Lock()
        self.spool: Path | None = None

    def _emit(self, *event) -> None:
        with self.lock:
            self.events.append(event)
            if self.spool:
                with open(self.spool, "a") as f:
                    f.write(json.dumps(event, default=str) + "\n")

    def take(self) -> list[tuple]:
        with self.lock:
            batch, self.events = self.events, []
        return batch

    def begin_run(self, **fields: Any) -> str:
        run_id = fields.pop("run_id", None) or new_run_id()
        fields.setdefault("started_at", now())
        fields |= self.overrides  # what only the driver knows (the experiment file's git commit)
        fields = self._with_node({"info_json": {}, **fields})
        self.spool = self.runs_dir / run_id / RELAY_NAME
        self.spool.parent.mkdir(parents=True, exist_ok=True)
        self._emit("begin_run", run_id, fields)
        return run_id

    def claim_run(self, trial_key: str, since, owner: Owner, **fields: Any) -> Claim:
        """The driver alone reads DuckDB and hands each trial to one task: on the node the claim is the begin."""
        return Claim(self.begin_run(trial_key=trial_key, **owner.fields(), **fields))

    def heartbeat(self, run_id: str) -> None:
        self._emit("update_run", run_id, {"heartbeat_at": now()})

    def _with_node(self, fields: dict) -> dict:
        if "info_json" in fields:  # a later write of info replaces the column: the node stays in it
            fields["info_json"] = {**fields["info_json"], "ray": self.node}
        return fields

    def update_run(self, run_id: str, **fields: Any) -> None:
        self._emit("update_run", run_id, self._with_node(fields))

    def finish_run(self, run_id: str, status: str, reason: str | None = None, summary: dict | None = None,
                   **fields: Any) -> None:
        self._emit("finish_run", run_id, {"status": status, "reason": reason, "summary": summary,
                                          "ended_at": now(), **self._with_node(fields)})

    def add_requests(self, run_id: str, records) -> None:
        rows = [r if isinstance(r, dict) else record_row(r) for r in records]
        self.rows.setdefault(run_id, []).extend(rows)
        self._emit("add_requests", run_id, rows)

    def requests(self, run_ids, measured_only: bool = True, with_chunks: bool = True):
        """The rows relayed so far, as store.Store.requests returns them (the summary is computed from them)."""
        import pandas as pd

        rows = [{**r, "run_id": run_id} for run_id in run_ids for r in self.rows.get(run_id, [])
                if not (measured_only and r["warmup"])]
        df = pd.DataFrame(sorted(rows, key=lambda r: (r["run_id"], r["idx"])), columns=list(REQUEST_COLUMNS))
        return df if with_chunks else df.drop(columns=["chunk_times"])

    def add_samples(self, run_id: str, samples) -> None:
        rows = [tuple(s) for s in samples]
        self.relayed_samples.setdefault(run_id, []).extend(rows)
        self._emit("add_samples", run_id, rows)

    def samples(self, run_ids, source: str | None = None):
        """The samples relayed so far, as store.Store.samples returns them."""
        import pandas as pd

        rows = [(run_id, *s) for run_id in run_ids for s in self.relayed_samples.get(run_id, [])
                if source is None or s[1] == source]
        return pd.DataFrame(sorted(rows, key=lambda r: (r[0], r[1])), columns=["run_id", "t", "source", "name", "value"])

    def ingest_spool(self, run_id: str, path) -> None:
        """Nothing to do here: a write is a list append, never refused, so every row was relayed already; the
        spool is kept (keeps_spool) for the driver's Store.recover."""

    # A capacity search on the node: its row is begun and finished on the driver, its points are runs as above.
    def begin_capacity(self, **fields: Any) -> str:
        search_id = fields.pop("search_id", None) or "cap-" + new_run_id()
        self._emit("begin_capacity", search_id, fields)
        return search_id

    def finish_capacity(self, search_id: str, status: str, reason: str | None = None, **fields: Any) -> None:
        self._emit("finish_capacity", search_id, {"status": status, "reason": reason, **fields})


def node_identity() -> dict[str, Any]:
    """Which Ray node this is: stored with the run beside the host, CPU, GPU and vLLM build it probed."""
    import ray

    ctx = ray.get_runtime_context()
    accel = [k.split(":", 1)[1] for k in ray.available_resources() if k.startswith("accelerator_type:")]
    return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "worker_pid": os.getpid(),
            "accelerator_type": accel[0] if accel else None, "gpu_ids": ctx.get_accelerator_ids().get("GPU", [])}


def trial_events(trial_json: dict, runs_dir: str, experiment_path: str | None, overrides: dict, gpu_id: str | None,
                 attempt: int, omp_num_threads: str | None, kind: str = "trial"):
    """Run one trial here (kind "trial": one launch; "capacity": its capacity searches, "capacity_launch": one
    search on one server) and yield
    its store events in batches; the last batch ends with ('result', ...)."""
    from qwen3lab.experiment import preflight
    from qwen3lab.experiment.spec import Trial
    from qwen3lab.measure import capacity, runner

    # Ray sets OMP_NUM_THREADS to the task's CPUs (1); the server reserved the slot, not one core.
    if omp_num_threads is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = omp_num_threads
    trial = Trial.model_validate(trial_json)
    relay = Relay(Path(runs_dir), overrides, {**node_identity(), "attempt": attempt})
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            if kind in ("capacity", "capacity_launch"):
                # "capacity": every launch of capacity.launches (a search's suggestion whose capacity is not stored
                # yet); "capacity_launch": one of them, as the driver's schedule (capacity.SEARCHES) places it
                search = capacity.capacity_of if kind == "capacity" else capacity.measure_capacity
                got = search(trial, relay, runs_dir, experiment_path, preflight.Machine.local(), gpu_id)
                outcome.update(status=got.status, reason=got.reason, search_id=got.search_id,
                               run_id=got.points[-1].run_id if got.points else None)
            else:
                result = runner.run_trial(trial, relay, runs_dir, experiment_path=experiment_path,
                                          machine=preflight.Machine.local(), gpu_id=gpu_id, log=lambda *_: None)
                outcome.update(status=result.status, reason=result.reason, run_id=result.run_id)
        except BaseException as exc:  # noqa: BLE001 - handed to the driver, which stores or reports it
            outcome.update(status="error", reason=f"{type(exc).__name__}: {exc}")

    # The trial runs in a thread that lives as long as its server (the server dies with that thread), while
    # this generator hands batches over.
    thread = threading.Thread(target=work, name="qwen3lab-trial", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(BATCH_S)
        if batch := relay.take():
            yield batch
    yield relay.take() + [("result", outcome.get("run_id"), outcome)]


def drop_spool(runs_dir: str, run_ids: list[str]) -> int:
    """Delete runs' spools (the relay's and the run's own) on their node once the driver has stored every event
    of them."""
    dropped = 0
    for run_id in run_ids:
        for path in (Path(runs_dir) / run_id / RELAY_NAME, Path(runs_dir) / run_id / SPOOL_NAME):
            if path.exists():
                path.unlink()
                dropped += 1
    return dropped
