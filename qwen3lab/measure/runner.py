"""One trial, end to end: pre-flight, run row, launch, load, telemetry, store; nothing measured is lost.

The run row is written before the server starts (status running) and finished after: ok, failed (did not
start), oom, timeout (no /health), crashed (died during the load), skipped (cannot run here), or
interrupted (Ctrl-C). Finished requests are stored right after the load (every RunSink.flush_every_s during a
long one), also when it ends in an error or Ctrl-C: nothing is stored, scraped or drawn on the loop that times
the streams (issue 16; bench/fidelity_bench.py measures it). Rows go to a RunSink (sink.py): the Store here,
a ray_worker.Relay on a Ray node.
"""
from __future__ import annotations

import json
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from qwen3lab import __version__
from qwen3lab.measure import engine, provenance, topology, workload as wl
from qwen3lab.hardware import catalogue as hardware
from qwen3lab.analysis import comparable, metrics, validity
from qwen3lab.experiment import preflight
from qwen3lab.errors import EngineError, SpecErrors
from qwen3lab.measure.loadgen import LoadResult, RequestRecord, run_load, run_sync
from qwen3lab.experiment.spec import Trial
from qwen3lab.redact import Redactor
from qwen3lab.spool import SPOOL_NAME, Spool
from qwen3lab.sink import RunSink
from qwen3lab.store import HEARTBEAT_S, Owner, finish_fields, new_run_id, request_row
from qwen3lab.store import now as store_now
from qwen3lab.measure.telemetry import MetricsScraper, NvmlSampler
from qwen3lab.traffic import build as traffic_build, replay
from qwen3lab.traffic.conversations import run_sessions

# Progress is shown every second; requests reach the sink during a load only every sink.flush_every_s (see
# _Flusher).
PROGRESS_EVERY_S = 1.0


@dataclass
class TrialResult:
    trial: Trial
    run_id: str
    status: str
    reason: str | None = None
    summary: dict | None = None


class _Flusher:
    """Takes finished records from the event loop (an append, nothing else) and stores them from a thread.

    The loop that timestamps streams must not wait for anything: a DuckDB write (a connection, Arrow tables,
    DuckDB's own threads) or a progress bar holds the GIL and the CPU the server needs. So the thread advances
    the progress bar and appends new records to the run's spool (one JSON line, fsync'ed: what a kill leaves)
    every PROGRESS_EVERY_S, and writes to DuckDB only every flush_every_s (a load of a few hundred requests is
    stored once, right after it); leaving the `with` stores the rest, also after an error or Ctrl-C. Records
    are never swapped out: a refused DuckDB write (disk full, the file held elsewhere) is noted in
    `store_error` and retried by the next one; the spool has them meanwhile.
    """

    def __init__(self, store: RunSink, spool: Spool, run_id: str, progress: Callable[[int], None] | None):
        self.store, self.spool, self.run_id, self.progress = store, spool, run_id, progress
        self.records: list[RequestRecord] = []  # only ever appended to, by the loop
        self.spooled = 0  # records[:spooled] are in the spool
        self.written = 0  # records[:written] are in the store
        self.shown = 0  # records[:shown] were counted on the progress bar
        self.store_error: str | None = None
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="qwen3lab-flush")

    def add(self, rec: RequestRecord) -> None:
        self.records.append(rec)  # list.append is atomic under the GIL: no lock on the loop

    def show(self) -> None:
        upto = len(self.records)
        if self.progress and upto > self.shown:
            self.progress(sum(not r.warmup for r in self.records[self.shown:upto]))
        self.shown = upto

    def spool_new(self) -> None:
        with self.lock:
            upto = len(self.records)
            if upto > self.spooled:
                self.spool.add_requests([request_row(r) for r in self.records[self.spooled:upto]])
                self.spooled = upto

    def flush(self) -> None:
        with self.lock:  # the thread's periodic write and the caller's last one
            self.spool_new()  # OSError (the spool's disk is full too) reaches the caller: nothing is safe yet
            if self.spooled > self.written:
                rows = [request_row(r) for r in self.records[self.written:self.spooled]]
                self.store_error = _try_store(self.store.add_requests, self.run_id, rows)
                if self.store_error is None:
                    self.written = self.spooled

    def _loop(self) -> None:
        last_flush = time.monotonic()
        every = self.store.flush_every_s  # the Ray relay's writes cost nothing during the load: often
        while not self.stop.wait(PROGRESS_EVERY_S):
            self.show()
            try:
                self.spool_new()
                if time.monotonic() - last_flush >= every:
                    self.flush()
                    last_flush = time.monotonic()
            except OSError:
                pass  # the spool's disk is full: the records stay in memory; the last flush raises it

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.show()
        self.flush()


def _try_store(write, *args, **kwargs) -> str | None:
    """Run one DuckDB write; the error as text when DuckDB refuses it (disk full, file held elsewhere)."""
    try:
        write(*args, **kwargs)
        return None
    except Exception as exc:  # noqa: BLE001 - duckdb.IOException, StoreError (lock), OSError: the spool has it
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


class _Heartbeat:
    """Marks the run row as owned by a live process every HEARTBEAT_S (see store.owner_alive)."""

    def __init__(self, store: RunSink, run_id: str):
        self.store, self.run_id = store, run_id
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="qwen3lab-heartbeat")

    def _loop(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            _try_store(self.store.heartbeat, self.run_id)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _chat_template_tokens(server: engine.Server, trial: Trial) -> int:
    """What the chat template adds around the user's text, asked of the server's own /tokenize."""
    if trial.workload.api != "chat":
        return 0
    import urllib.request

    body = {"model": server.model_name, "messages": [{"role": "user", "content": ""}], "add_generation_prompt": True}
    if trial.workload.enable_thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": trial.workload.enable_thinking}
    req = urllib.request.Request(server.base_url + "/tokenize", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **server.headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(json.loads(resp.read())["count"])
    except Exception:
        return 0  # not a vLLM server: prompt lengths then exclude the template


async def _measure(server: engine.Server, requests, trial: Trial, on_done,
                   stop_when: Callable[[list], bool] | None = None,
                   samples: Callable[[], list] = list) -> LoadResult:
    # stop_when sees the /metrics samples so far: a capacity point ends once its verdict is decided
    should_stop = (lambda: not server.alive()) if stop_when is None else \
        (lambda: not server.alive() or stop_when(samples()))
    load = run_sessions if replay.is_sessions(requests) else run_load  # a traffic file's conversations
    return await load(server.base_url, server.model_name, requests, trial.workload, on_done=on_done,
                      headers=server.headers, should_stop=should_stop)


@dataclass
class Begun:
    """A run row claimed before anything is launched; `skipped` when pre-flight says it cannot run here,
    `held` when another live qwen3lab holds the trial (then nothing is run, and run_id is the holder's)."""

    run_id: str
    info: dict
    skipped: str | None = None
    held: str | None = None
    log_path: Path | None = None
    spool: Spool | None = None
    fields: dict = field(default_factory=dict)
    hide: Redactor | None = None
    logs: list[Path] = field(default_factory=list)  # every log its launch writes (topology.log_paths)


def begin_run(trial: Trial, store: RunSink, experiment_path: str | None = None, notebook_path: str | None = None,
              machine: preflight.Machine | None = None, gpu_id: str | None = None,
              verdict: preflight.Verdict | None = None, runs_dir: str | Path = "runs",
              since: datetime | None = None, **link) -> Begun:
    """Pre-flight (unless the caller's `verdict` judged it already), then the run row: skipped with the reason,
    or claimed (status running, this process its owner) unless another live qwen3lab holds the trial.
    Raises SpecErrors first. `since` is when the caller looked for the trial's earlier runs (the executor's
    plan): a run another qwen3lab began after it counts as this launch, even if it has finished meanwhile.

    `link` are extra run columns, e.g. a capacity point's search_id, point_index, offered_load and the log of
    the server it shares (log_path)."""
    entered = since or store_now()  # a run of this trial begun after this by another qwen3lab: not run twice
    probe = hardware.probe()
    if verdict is None:
        verdict = preflight.check(trial, machine or preflight.Machine.local(), gpu_id)
    if verdict.errors:
        raise SpecErrors(verdict.errors)
    hide = Redactor(trial.engine)  # secret values never reach the store, the spool or the kept logs
    run_id = link.pop("run_id", None) or new_run_id()
    own_dir = Path(runs_dir) / run_id
    log_path = Path(link.pop("log_path", None) or own_dir / "server.log")
    fields = provenance.run_fields(trial, experiment_path, notebook_path, probe) | link
    fields["info_json"] = {"qwen3lab_version": __version__, "preflight_notes": verdict.notes, "plan": verdict.plan,
                           "machine": probe}
    if verdict.plan:
        fields["planner_kv_tokens"] = verdict.plan.get("kv_capacity_tokens")
    fields = hide(fields)
    if verdict.skip:
        run_id = store.begin_run(status="skipped", reason=verdict.skip, run_id=run_id, **fields)
        store.finish_run(run_id, "skipped", verdict.skip)
        return Begun(run_id, fields["info_json"], skipped=verdict.skip)
    spool = Spool(own_dir / SPOOL_NAME)  # the run's own folder: capacity points share a server log, not a spool
    claim = store.claim_run(fields.pop("trial_key"), entered, Owner.me(), run_id=run_id, log_path=str(log_path),
                            spool_path=str(spool.path), **fields)
    if claim.run_id is None:
        return Begun(str(claim.held_by["run_id"]), fields["info_json"], held=claim.reason)
    return Begun(run_id, fields["info_json"], log_path=log_path, spool=spool, fields=fields, hide=hide,
                 logs=list(topology.log_paths(trial.engine, log_path).values()))


@dataclass
class Measured:
    status: str
    reason: str | None
    summary: dict
    extra: dict  # run columns learnt while measuring (build, digests, client CPU, ...)
    records: list
    refused: list[str] = field(default_factory=list)  # DuckDB writes refused meanwhile (the spool has them)


def measure(server: engine.Server, trial: Trial, store: RunSink, begun: Begun,
            progress: Callable[[int], None] | None = None, on_done: Callable[[RequestRecord], None] | None = None,
            stop_when: Callable[[list], bool] | None = None) -> Measured:
    """Load a running server with the trial's workload; its requests reach the run's spool, then DuckDB.

    Several calls may share one server (a capacity search's load points); each is its own run."""
    run_id, fields, hide, spool = begun.run_id, begun.fields, begun.hide, begun.spool
    build = server.build
    extra = {"exec_argv_json": server.exec_argv, "vllm_version": server.info.get("version", {}).get("version")
             or (build.vllm_version if build else None),
             "torch_version": build.torch_version if build else None,
             "python_executable": build.python if build else None,
             "vllm_kv_tokens": server.info.get("kv_cache_tokens"), "start_s": server.info.get("start_s"),
             "compile_cache": server.info.get("compile_cache"),
             "attention_backend": server.info.get("attention_backend"),
             "flash_attn_version": server.info.get("flash_attn_version")}
    if server.info.get("emulation"):  # the utilization that capped memory to the target card's budget
        fields["info_json"] = extra["info_json"] = {**fields["info_json"], "emulation": server.info["emulation"]}
    refused: list[str | None] = [_try_store(store.update_run, run_id, **hide(extra))]
    # The server's own GPUs: its env may narrow CUDA_VISIBLE_DEVICES (NVML itself ignores that variable).
    sampler = NvmlSampler(interval_s=trial.workload.gpu_sample_interval_s or 0.5, t0=0.0, log=None,
                          visible_devices=getattr(trial.engine, "env", {}).get("CUDA_VISIBLE_DEVICES"))
    flusher = _Flusher(store, spool, run_id, progress)
    try:
        with flusher:
            def done(rec: RequestRecord) -> None:
                flusher.add(rec)
                if on_done:
                    on_done(rec)

            tokenizer = wl.load_tokenizer(wl.tokenizer_source(trial.engine))
            max_len = server.info.get("max_model_len") or getattr(trial.engine, "max_model_len", None)
            template = _chat_template_tokens(server, trial)
            requests = traffic_build.requests(trial.workload, tokenizer, max_len, template)
            traffic_build.verify(requests, tokenizer, template)
            extra |= {"requests_digest": wl.requests_digest(requests), "tokenizer_fingerprint": tokenizer.fingerprint}
            if trial.workload.gpu_sample_interval_s:
                sampler.start()
            else:
                sampler.why_not = "not sampled (workload.gpu_sample_interval_s: null)"
            # /metrics is scraped by a child process, never on the load's loop (see telemetry.MetricsScraper);
            # a stop_when (a capacity point's saturation check) reads its file as it grows, once a second.
            with MetricsScraper(server.base_url, trial.workload.scrape_interval_s, 0.0, server.headers) as scraper:
                result = run_sync(_measure(server, requests, trial, done, stop_when, scraper.so_far))
            scraped = scraper.samples
            sampler.stop()
    finally:
        sampler.stop()
        if sampler.why_not:
            extra["info_json"] = {**fields["info_json"], "gpu_telemetry": sampler.why_not}
    # From the stored rows, as every comparison reads them: the Runs table and Compare agree.
    summary = _summary(store, run_id, flusher, result, trial)
    client_cpu_s = result.client_cpu_s + scraper.cpu_s  # the scraper's process is the client's too
    summary |= {"client_cpu_s": client_cpu_s, "scraper_cpu_s": scraper.cpu_s, "gpu_sampler_cpu_s": sampler.cpu_s,
                "max_model_len": max_len,
                "template_tokens": template,
                "length_scale": getattr(requests[0], "scale", None) if requests else None,  # fit_to_context: scale
                "client_connections": result.connections,  # kept alive: about the concurrency, not the requests
                "client_cpu_s_per_1k_tokens": 1000 * client_cpu_s / max(summary["total_output_tokens"], 1)}
    if result.loop_lag_s:  # the client's own stalls: large ones skew TTFT and TPOT (issue 16)
        lag_ms = sorted(1000 * x for x in result.loop_lag_s)
        summary |= {"client_loop_lag_p99_ms": lag_ms[int(0.99 * (len(lag_ms) - 1))],
                    "client_loop_lag_max_ms": lag_ms[-1]}
    summary |= sampler.summary() if sampler.samples else {}
    if isinstance(server, topology.SplitServer) and server.alive():  # the router's own cost, paired
        summary |= topology.added_latency(server, requests, trial.workload)
    samples = [(t - result.t0_perf, s, n, v) for t, s, n, v in scraped]
    samples += [(t - result.t0_perf, s, n, v) for t, s, n, v in sampler.samples]
    spool.add_samples(samples)
    refused.append(_try_store(store.add_samples, run_id, samples))
    extra |= {"client_cpu_s": client_cpu_s, "peak_gpu_memory_mib": sampler.peak_memory_mib()}
    measured = [r for r in result.records if not r.warmup]
    planned = None if trial.workload.duration_s or replay.is_sessions(requests) else \
        replay.offsets(trial.workload, requests[len(requests) - len(measured):])
    check = validity.assess(metrics.RequestTable.from_records(measured), result.duration_s,
                            client_cpu_s, [r.sent_at for r in measured], planned,
                            ramp=trial.workload.concurrency or 0)
    extra |= {"validity": validity.label(check), "checks_json": check,
              "comparability_key": comparable.comparability_key({**fields, **extra})}
    if not server.alive():
        status, reason = server.death()
    elif result.stalled:  # up, but sent nothing for stall_timeout_s: stopped by the stall watch
        status, reason = "timeout", result.stalled
    elif summary["completed"] == 0:
        status, reason = "failed", _first_error(result.records)
    else:
        status, reason = "ok", None
        if summary["failed"]:
            reason = f"{summary['failed']} requests failed; first: {_first_error(result.records)}"
    return Measured(status, reason, summary, extra, result.records,
                    [e for e in (*refused, flusher.store_error) if e])


def record_failure(log_path: Path, exc: BaseException) -> tuple[str, str]:
    """(status, reason) of an error met while running a trial, its traceback appended to the server log."""
    if isinstance(exc, EngineError):
        return exc.outcome, exc.reason
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as f:
        f.write("\n# qwen3lab error\n" + "".join(traceback.format_exception(exc)))
    return "failed", f"{type(exc).__name__}: {exc}"


def hide_logs(config, log_path: str | Path) -> None:
    """Secrets out of every log a launch of `config` wrote; for a server shared by several runs (capacity points,
    soak windows), once it is down, so a start that failed before any run is covered too."""
    Redactor(config).files(topology.log_paths(config, log_path).values())


def finish(store: RunSink, begun: Begun, status: str, reason: str | None, summary: dict | None, extra: dict,
           refused: list[str] = (), log: Callable[[str], None] = print) -> str | None:
    """The run's end: secrets hidden in the kept logs, the last fields spooled, then stored (see _store_final).
    Returns the reason to report."""
    begun.hide.files(begun.logs)
    return _store_final(store, begun.spool, begun.run_id, begun.hide(finish_fields(status, reason, summary, **extra)),
                        list(refused), log)


def run_trial(trial: Trial, store: RunSink, runs_dir: str | Path = "runs", experiment_path: str | None = None,
              notebook_path: str | None = None, machine: preflight.Machine | None = None,
              progress: Callable[[int], None] | None = None, log: Callable[[str], None] = print,
              ready_timeout_s: float = 900.0, gpu_id: str | None = None,
              verdict: preflight.Verdict | None = None, since: datetime | None = None) -> TrialResult:
    """Run one trial and store everything about it. Raises SpecErrors (before any launch) for a bad trial.
    `verdict` is the trial's pre-flight verdict when the caller judged it already (executor.plan); `since`
    when it looked for the trial's earlier runs (begin_run).
    A trial another live qwen3lab holds is not run: its result has status `held`."""
    begun = begin_run(trial, store, experiment_path, notebook_path, machine, gpu_id, verdict, runs_dir, since)
    if begun.skipped:
        return TrialResult(trial, begun.run_id, "skipped", begun.skipped)
    if begun.held:
        return TrialResult(trial, begun.run_id, "held", begun.held)
    status, reason, summary, extra, refused = "failed", None, None, {}, []
    with _Heartbeat(store, begun.run_id):
        try:
            with topology.open_engine(trial.engine, begun.log_path, ready_timeout_s) as server:
                got = measure(server, trial, store, begun, progress)
                status, reason, summary, extra, refused = got.status, got.reason, got.summary, got.extra, got.refused
        except KeyboardInterrupt:
            status, reason = "interrupted", "stopped by the user (Ctrl-C)"
            raise
        except Exception as exc:  # noqa: BLE001 - stored with its traceback, then the sweep goes on
            status, reason = record_failure(begun.log_path, exc)
        finally:
            reason = finish(store, begun, status, reason, summary, extra, refused, log)
    return TrialResult(trial, begun.run_id, status, reason, summary)


def _summary(store: RunSink, run_id: str, flusher: _Flusher, result: LoadResult, trial: Trial) -> dict:
    """Metrics over the stored rows; when DuckDB refused some of them, over the same rows built from the
    records in memory (what the spool holds), so a full disk or a held file does not turn a run into a failure."""
    if flusher.store_error is None:
        try:
            return metrics.summarize_rows(store.requests([run_id]), result.duration_s, trial.slo,
                                          opening_burst(trial.workload))
        except Exception:  # noqa: BLE001 - DuckDB refused the read: fall back to the records below
            flusher.store_error = flusher.store_error or "reading the run's rows back failed"
    return metrics.summarize(metrics.RequestTable.from_records(result.records), result.duration_s, trial.slo,
                             opening_burst(trial.workload))


def _store_final(store: RunSink, spool: Spool, run_id: str, final: dict, refused: list[str], log) -> str | None:
    """The run's last fields, spooled and then stored; rows DuckDB refused during the load are ingested first.
    When DuckDB still refuses, the row stays `running` under this process: the next start finishes it from
    the spool (Store.recover). Returns the reason to report."""
    try:
        spool.finish(final)
    except OSError as exc:  # its disk is full too: DuckDB may still take the row
        log(f"could not append the run's end to {spool.path}: {exc}")
    error = (_try_store(store.ingest_spool, run_id, spool.path) if refused else None) \
        or _try_store(store.update_run, run_id, **final, spool_path=None)
    if error is None:
        if not store.keeps_spool:  # a Ray relay's rows are not in DuckDB yet
            spool.remove()
        return final["reason"]
    note = (f"DuckDB refused the run's writes ({error}); everything measured is kept in {spool.path} and is "
            "stored by the next qwen3lab start")
    log(note)
    return f"{final['reason']}; {note}" if final["reason"] else note


def opening_burst(workload) -> int:
    """Requests a closed loop sends at once on an idle server when the measured phase opens: its concurrency
    (an open loop, `request_rate`, ramps in by its arrivals and has none)."""
    return 0 if workload.request_rate else int(workload.concurrency or 0)


def _first_error(records: list[RequestRecord]) -> str:
    return next((r.error for r in records if r.error), "no request completed")
