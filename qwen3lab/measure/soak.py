"""Soak: one configuration under the experiment's traffic for hours; a server that dies is counted and restarted.

A soak is a sequence of windows on one server, like a capacity search's load points: each window sends the
trial's traffic for `window_s` seconds and is a run of its own, linked to the soak (runs.soak_id, soak_window),
stored when it ends. So a 72-hour soak holds one window's records in memory, a kill loses at most the window
in flight (its spool has that), and each window has the full summary: latency percentiles, throughput, GPU
memory, plus the server's RSS at its end, and vLLM's KV cache usage and preemptions in its samples.

A server that dies (crash, out of memory, or one that does not start) is counted and started again, up to
`max_restarts`; the soak ends once it has had its duration under load (server starts do not count), when the
restarts are spent, or at Ctrl-C. Its row (soaks)
holds the counts and the drift of the last window against the first (analysis/drift.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from qwen3lab.errors import EngineError, SpecErrors
from qwen3lab.experiment import preflight
from qwen3lab.experiment.spec import Trial, Workload
from qwen3lab.measure import runner, topology
from qwen3lab.measure.events import Listener
from qwen3lab.store import Store, now

ENDS = ("ok", "restarts_spent", "failed", "interrupted", "skipped")


@dataclass
class Window:
    index: int
    run_id: str
    status: str
    reason: str | None
    server_start: int  # which start of the server measured it (1 = the first)
    summary: dict | None = None


@dataclass
class SoakResult:
    soak_id: str
    trial: Trial
    status: str = "running"
    reason: str | None = None
    windows: list[Window] = field(default_factory=list)
    server_starts: int = 0
    crashes: int = 0
    ooms: int = 0
    elapsed_s: float = 0.0  # wall time, server starts and restarts included
    drift: dict = field(default_factory=dict)
    loaded_s: float = 0.0  # time with a server up and under load: what the duration counts
    up_since: float | None = None  # monotonic time the current server became ready

    def left_s(self, duration_s: float) -> float:
        up = 0.0 if self.up_since is None else time.monotonic() - self.up_since
        return duration_s - self.loaded_s - up

    @property
    def restarts(self) -> int:
        return max(self.server_starts - 1, 0)

    def as_dict(self) -> dict:
        return {"soak_id": self.soak_id, "trial": self.trial.name, "chapter": self.trial.chapter,
                "status": self.status, "reason": self.reason, "windows": len(self.windows),
                "server_starts": self.server_starts, "restarts": self.restarts, "crashes": self.crashes,
                "ooms": self.ooms, "elapsed_s": self.elapsed_s, "drift": self.drift,
                "window_runs": [{"index": w.index, "run_id": w.run_id, "status": w.status, "reason": w.reason,
                                 "server_start": w.server_start} for w in self.windows]}


def window_trial(trial: Trial, seconds: float, warm: bool) -> Trial:
    """One window's trial: the trial's traffic for `seconds`; warm-up requests only on a server's first window.
    Every window sends the same request mix (same seed): what changes between windows is the server."""
    update = {"duration_s": seconds, "capacity": None} | ({} if warm else {"warmup_requests": 0})
    workload = Workload.model_validate(trial.workload.model_dump() | update)
    return trial.model_copy(update={"workload": workload, "tags": {**trial.tags, "soak_of": trial.name},
                                    "baseline": None})


def server_rss_mib(server) -> float | None:
    """Resident memory of the server's process tree (API server, engine core, workers), MiB."""
    import psutil

    proc = getattr(server, "process", None)
    if proc is None or proc.poll() is not None:
        return None
    try:
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for p in tree:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def soak(trial: Trial, store: Store, runs_dir: str | Path, duration_s: float, window_s: float,
         max_restarts: int = 3, experiment_path: str | None = None, machine: preflight.Machine | None = None,
         gpu_id: str | None = None, listener: Listener | None = None, ready_timeout_s: float = 900.0,
         n_boot: int = 1000) -> SoakResult:
    """Keep `trial`'s configuration under its traffic for `duration_s`, in windows of `window_s` (see module).
    The listener hears of each server start (launching), each window (point) and the soak's end (finished)."""
    listener = listener or Listener(print)
    machine = machine or preflight.Machine.local()
    verdict = preflight.check(trial, machine, gpu_id)
    if verdict.errors:
        raise SpecErrors(verdict.errors)
    cfg = trial.engine
    soak_id = store.begin_soak(trial_key=trial.key, experiment=trial.experiment, chapter=trial.chapter,
                               trial=trial.name, config_hash=cfg.config_hash(), duration_s=duration_s,
                               window_s=window_s, max_restarts=max_restarts)
    result = SoakResult(soak_id, trial)
    listener.started(f"soak {soak_id}", None)
    if verdict.skip:
        result.status, result.reason = "skipped", verdict.skip
        store.update_soak(soak_id, status="skipped", reason=verdict.skip, ended_at=now())
        return result
    began = time.monotonic()
    soak_dir = Path(runs_dir) / soak_id
    try:
        while result.left_s(duration_s) > 0 and result.status == "running":
            result.server_starts += 1
            listener.launching(trial, f"server start {result.server_starts} of soak {soak_id}")
            death = _serve(trial, store, soak_dir / f"server-{result.server_starts}.log", duration_s, window_s,
                           result, experiment_path, machine, gpu_id, verdict, listener, ready_timeout_s)
            if death is None:
                continue  # the duration is up, or a window was held by another qwen3lab (status set)
            outcome, why = death
            if outcome == "oom":
                result.ooms += 1
            else:
                result.crashes += 1
            if result.restarts >= max_restarts:
                result.status = "restarts_spent"
                result.reason = f"the server died {result.crashes + result.ooms} times (last: {outcome}: {why}); " \
                                f"max_restarts={max_restarts}"
            else:
                listener.log(f"soak {soak_id}: the server died ({outcome}: {why}); starting it again "
                    f"({result.restarts + 1} of {max_restarts} restarts)")
        if result.status == "running":
            result.status = "ok"
    except KeyboardInterrupt:
        result.status, result.reason = "interrupted", "stopped by the user (Ctrl-C)"
        raise
    except Exception as exc:  # noqa: BLE001 - the windows measured so far stay stored; the row says why
        result.status, result.reason = "failed", f"{type(exc).__name__}: {exc}"
        raise
    finally:
        result.elapsed_s = time.monotonic() - began
        from qwen3lab.analysis import drift

        try:
            result.drift = drift.first_last(store, soak_id, trial.slo, n_boot=n_boot)
        except Exception as exc:  # noqa: BLE001 - the counts are stored even when the comparison fails
            result.drift = {"note": f"drift not computed: {type(exc).__name__}: {exc}"}
        store.update_soak(soak_id, status=result.status, reason=result.reason, windows=len(result.windows),
                          server_starts=result.server_starts, crashes=result.crashes, ooms=result.ooms,
                          elapsed_s=result.elapsed_s, drift_json=result.drift, ended_at=now())
        listener.finished(trial, result.status, f"{len(result.windows)} windows, {result.server_starts} server "
                          f"starts, {result.restarts} restarts" + (f" ({result.reason})" if result.reason else ""))
    return result


def _serve(trial, store, log_path, duration_s, window_s, result, experiment_path, machine, gpu_id, verdict,
           listener, ready_timeout_s) -> tuple[str, str] | None:
    """One server start: windows until the duration is up. (outcome, reason) when the server died, else None."""
    try:
        with topology.open_engine(trial.engine, log_path, ready_timeout_s) as server:
            result.up_since = time.monotonic()  # starts and restarts are not soak time: load is
            warm = True
            while (left := result.left_s(duration_s)) > 0:
                # the last window may be shorter, but not a sliver: under a third of a window joins the one before
                seconds = left if left < window_s * 4 / 3 else window_s
                w = _window(trial, seconds, warm, server, store, result, experiment_path, machine, gpu_id,
                            verdict, lambda n: listener.requests_done(trial, n))
                warm = False
                result.windows.append(w)
                listener.point(trial, told_window(w, result))
                if w.status == "held":
                    result.status, result.reason = "failed", w.reason
                    return None
                if not server.alive():
                    return server.death()
            return None
    except EngineError as exc:  # did not start, or died starting: counted like a crash
        return exc.outcome, exc.reason
    finally:
        runner.hide_logs(trial.engine, log_path)
        if result.up_since is not None:
            result.loaded_s += time.monotonic() - result.up_since
            result.up_since = None


def told_window(w: Window, result: SoakResult) -> str:
    """A window's line: its status and key figures, and where the soak stands."""
    s = w.summary or {}
    figures = (f", {s.get('completed', 0)} requests, {s.get('output_throughput') or 0:.0f} tok/s, P95 TTFT "
               f"{s.get('p95_ttft_ms') or 0:.0f} ms") if s else ""
    return (f"window {w.index + 1} (server start {w.server_start}): {w.status}{figures}"
            + (f" ({w.reason})" if w.reason else "") + f"; {len(result.windows)} windows, {result.restarts} "
            f"restarts, {_under_load_s(result):.0f} s under load")


def _under_load_s(result: SoakResult) -> float:
    return result.loaded_s + (time.monotonic() - result.up_since if result.up_since is not None else 0.0)


def _window(trial, seconds, warm, server, store, result, experiment_path, machine, gpu_id, verdict,
            progress) -> Window:
    wt = window_trial(trial, seconds, warm)
    begun = runner.begin_run(wt, store, experiment_path, None, machine, gpu_id, verdict=verdict,
                             runs_dir=Path(server.log_path).parent if server.log_path else "runs",
                             soak_id=result.soak_id, soak_window=len(result.windows),
                             log_path=str(server.log_path or ""))
    index = len(result.windows)
    if begun.held:
        return Window(index, begun.run_id, "held", begun.held, result.server_starts)
    status, reason, summary, extra, refused = "failed", None, None, {}, []
    try:
        got = runner.measure(server, wt, store, begun, progress)
        status, reason, summary, extra, refused = got.status, got.reason, got.summary, got.extra, got.refused
    except KeyboardInterrupt:
        status, reason = "interrupted", "stopped by the user (Ctrl-C)"
        raise
    except EngineError as exc:
        status, reason = exc.outcome, exc.reason
    finally:
        reason = runner.finish(store, begun, status, reason, summary,
                               {**extra, "server_rss_mib": server_rss_mib(server)}, refused)
    return Window(index, begun.run_id, status, reason, result.server_starts, summary)


# --- from an experiment file ------------------------------------------------------------------------------
def parse_duration(text: str, name: str = "--duration") -> float:
    """'72h', '90m', '1h30m', '45s' or plain seconds -> seconds."""
    import re

    from qwen3lab.errors import Qwen3LabError

    text = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    else:
        parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", text)
        if not text or parts is None:
            raise Qwen3LabError(f"{name} {text!r} is not a duration: write seconds (600) or units d, h, m, s "
                                "(72h, 90m, 1h30m, 45s)")
        d, h, m, s = (float(x or 0) for x in parts.groups())
        seconds = d * 86400 + h * 3600 + m * 60 + s
    if seconds <= 0:
        raise Qwen3LabError(f"{name} {text!r} must be longer than zero")
    return seconds


def default_window_s(duration_s: float) -> float:
    """A dozen windows over the soak, each 10 s to 10 min: enough to see a trend, few rows a day."""
    return min(max(duration_s / 12, 10.0), 600.0)


def pick_trial(trials: list[Trial], ref: str | None, path) -> Trial:
    """The trial named `ref` (NAME or CHAPTER/NAME); without one, the soak chapter's first trial, else the first."""
    from qwen3lab.errors import Qwen3LabError

    if ref is None:
        soaks = [t for t in trials if t.chapter == "soak"]
        return (soaks or trials)[0]
    chapter, _, name = ref.rpartition("/")
    found = [t for t in trials if t.name == name and (not chapter or t.chapter == chapter)]
    if len(found) != 1:
        known = ", ".join(f"{t.chapter}/{t.name}" for t in trials)
        what = "no trial" if not found else f"{len(found)} trials"
        raise Qwen3LabError(f"--trial {ref!r}: {what} of that name in {path}. Fix: name one of {known}")
    return found[0]


def run_soak(experiment_path: str | Path, db: str, trial_ref: str | None, duration: str, window: str | None,
             max_restarts: int, runs_dir: str | Path, listener: Listener | None = None) -> SoakResult:
    """`qwen3lab soak`: the experiment's trial (see pick_trial) for `duration`; everything checked first."""
    from qwen3lab.experiment import files as xp

    duration_s = parse_duration(duration)
    window_s = parse_duration(window, "--window") if window else default_window_s(duration_s)
    if max_restarts < 0:
        from qwen3lab.errors import Qwen3LabError

        raise Qwen3LabError(f"--max-restarts {max_restarts} must be 0 or more (0: stop at the first death)")
    exp = xp.load(experiment_path)
    trial = pick_trial(xp.expand(exp), trial_ref, experiment_path)
    return soak(trial, Store(db), runs_dir, duration_s, min(window_s, duration_s), max_restarts,
                str(Path(experiment_path).resolve()), gpu_id=exp.gpu, listener=listener)
