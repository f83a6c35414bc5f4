"""Capacity of one configuration under its SLOs: the largest load one server sustains while the SLOs hold.

One server stays up for every load point of a configuration (a start costs minutes on a GPU): health-checked
between points, its prefix cache reset where vLLM allows it (else each point gets a fresh prompt seed, so prefix
hits never carry over), a warm-up at the start of each point. The load is doubled up to the first failing point,
then bisected until the bracket is within the tolerance. Each point is a run of its own, linked to its search
(search_id, point_index), and judged on its steady state (measure.loadpoint: arrivals many request lives long,
ramp-up and tail judged apart, flow, queue trend, SLO); a transient point never decides a capacity, and a
capacity above the goodput of its own passing point is refused (`holds`). The capacity and its bracket are
stored in `capacities`. With `capacity.launches: N` a configuration is searched on N fresh launches (a search
each); its capacity is their median, its interval spans every launch's bracket.
"""
from __future__ import annotations

import json
import math
import statistics
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from qwen3lab import campaign
from qwen3lab.errors import EngineError, SpecErrors
from qwen3lab.experiment import preflight
from qwen3lab.experiment.spec import Capacity, Trial, Workload
from qwen3lab.measure import engine, executor, loadpoint, runner, schedule, topology
from qwen3lab.measure.events import Listener
from qwen3lab.store import Store

# Outcomes of a whole search: bracketed, no failure found within max_points, or no point passed.
SEARCH_DONE = ("ok", "unbounded", "none_passed")


@dataclass
class Point:
    index: int
    load: float
    run_id: str
    status: str  # the run's status (ok, crashed, ...)
    passed: bool
    attainment: float | None
    why: str  # what decided the verdict
    summary: dict | None = None
    steady: dict | None = None  # loadpoint.assess: rates, window, queue trends, what failed, transient

    @property
    def verdict(self) -> str:
        """pass, fail, or transient (too short to show a steady state: decides nothing)."""
        return "pass" if self.passed else "transient" if (self.steady or {}).get("transient") else "fail"

    def row(self) -> dict:
        """What `qwen3lab capacity --json` and the dashboard show of a point."""
        st, summary = self.steady or {}, self.summary or {}
        return {"index": self.index, "load": self.load, "run_id": self.run_id, "status": self.status,
                "passed": self.passed, "verdict": self.verdict, "why": self.why, "failed_by": st.get("failed"),
                "attainment": self.attainment,
                **{k: st.get(k) for k in ("transient", "offered_rate", "served_rate", "goodput_rate", "steady_s")},
                "queue_trend": {k: v and {"slope": v["slope"], "p": v["p"]} for k, v in
                                (st.get("queue_trend") or {}).items()},
                **{k: summary.get(k) for k in ("p95_ttft_ms", "p95_tpot_ms")}}


@dataclass
class CapacityResult:
    trial: Trial
    search_id: str
    axis: str
    status: str  # ok | unbounded | none_passed | failed | oom | timeout | crashed | interrupted | skipped | resumed
    reason: str | None = None
    capacity: float | None = None
    low: float | None = None
    high: float | None = None
    points: list[Point] = field(default_factory=list)
    start_s: float | None = None
    measure_s: float = 0.0
    launches: list[CapacityResult] = field(default_factory=list)  # the searches combined, when more than one

    def as_dict(self) -> dict:
        return {"experiment": self.trial.experiment, "chapter": self.trial.chapter, "trial": self.trial.name,
                "search_id": self.search_id, "axis": self.axis, "status": self.status, "reason": self.reason,
                "capacity": self.capacity, "interval": [self.low, self.high], "start_s": self.start_s,
                "measure_s": self.measure_s,
                "points": [p.row() for p in self.points],
                "launches": [{"search_id": r.search_id, "status": r.status, "capacity": r.capacity,
                              "interval": [r.low, r.high], "start_s": r.start_s} for r in self.launches or [self]]}


# --- the search on the load axis (pure: tested without a server) ------------------------------------------
def first_load(spec: Capacity, workload: Workload) -> float:
    own = {"request_rate": workload.request_rate, "concurrency": workload.concurrency,
           "time_scale": workload.source.time_scale if workload.source else None}[spec.axis]
    value = spec.start or own or 1.0
    return float(max(1, round(value))) if spec.axis == "concurrency" else float(value)


def bracket(points: list[tuple[float, bool]]) -> tuple[float | None, float | None]:
    """(largest passing load below the first failing one, smallest failing load); None where there is none."""
    fails = [load for load, ok in points if not ok]
    high = min(fails) if fails else None
    passes = [load for load, ok in points if ok and (high is None or load < high)]
    return (max(passes) if passes else None), high


def next_load(points: list[tuple[float, bool]], spec: Capacity, start: float) -> float | None:
    """The next load to measure, or None when the search is over: double to the first failure, then bisect."""
    if not points:
        return start
    if len(points) >= spec.max_points:
        return None
    low, high = bracket(points)
    whole = spec.axis == "concurrency"
    if high is None:  # no failure yet: double
        return points[-1][0] * 2
    if low is None:  # even the lowest failed: halve towards zero
        nxt = math.floor(high / 2) if whole else high / 2
        return nxt if nxt >= (1 if whole else 1e-3) else None
    if (high - low) / high <= spec.tolerance:
        return None
    mid = math.floor((low + high) / 2) if whole else (low + high) / 2
    return None if whole and mid <= low else mid


# --- one configuration ------------------------------------------------------------------------------------
def reset_prefix_cache(server: engine.Server) -> bool:
    """vLLM's POST /reset_prefix_cache (served only with VLLM_SERVER_DEV_MODE=1); False where it is not."""
    req = urllib.request.Request(server.base_url + "/reset_prefix_cache", data=b"", method="POST",
                                 headers=server.headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status == 200 and bool(json.loads(resp.read() or b"{}").get("success", True))
    except Exception:
        return False


def healthy(server: engine.Server) -> bool:
    if not server.alive():
        return False
    try:
        return engine.http_get(server.base_url + "/health", timeout=10, headers=server.headers)[0] == 200
    except OSError:
        return False


def measure_capacity(trial: Trial, store: Store, runs_dir: str | Path = "runs", experiment_path: str | None = None,
                     machine: preflight.Machine | None = None, gpu_id: str | None = None,
                     on_point: Callable[[Point], None] | None = None,
                     progress: Callable[[int], None] | None = None, ready_timeout_s: float = 900.0,
                     on_server: Callable[[engine.Server], None] | None = None,
                     verdict: preflight.Verdict | None = None) -> CapacityResult:
    """The capacity of one trial's configuration on one server; every point and the result are stored.
    `verdict` is the trial's pre-flight verdict when the caller judged it already (executor.plan)."""
    spec = trial.workload.capacity or Capacity()
    machine = machine or preflight.Machine.local()
    verdict = verdict or preflight.check(trial, machine, gpu_id)
    if verdict.errors:
        raise SpecErrors(verdict.errors)
    search_id = store.begin_capacity(
        trial_key=trial.key, experiment=trial.experiment, chapter=trial.chapter, trial=trial.name,
        config_hash=trial.engine.config_hash(), axis=spec.axis, criterion=spec.criterion,
        min_attainment=spec.min_attainment, tolerance=spec.tolerance, spec_json=spec.model_dump(mode="json"),
        campaign_id=campaign.current())
    result = CapacityResult(trial, search_id, spec.axis, "failed")
    if verdict.skip:
        result.status, result.reason = "skipped", verdict.skip
        store.finish_capacity(search_id, "skipped", verdict.skip, points=0, server_starts=0)
        return result
    log_path = Path(runs_dir) / search_id / "server.log"
    start = first_load(spec, trial.workload)
    measured: list[tuple[float, bool]] = []  # (load, passed) of the points that decide: not a first transient
    lives: list[tuple[float, float, bool]] = []  # (load, median E2EL, passed) of each point: plan the next ones
    t_launch = time.monotonic()
    try:
        with topology.open_engine(trial.engine, log_path, ready_timeout_s) as server:
            result.start_s = time.monotonic() - t_launch
            if on_server:
                on_server(server)
            while len(result.points) < spec.max_points and (load := next_load(measured, spec, start)) is not None:
                if not healthy(server):
                    result.status, result.reason = server.death() if not server.alive() else \
                        ("crashed", "/health stopped answering 200 between load points")
                    break
                cache_reset = reset_prefix_cache(server)
                point = _measure_point(trial, spec, load, len(result.points), not cache_reset, server, store,
                                       search_id, experiment_path, machine, gpu_id, progress,
                                       loadpoint.planned_life(lives, load))
                result.points.append(point)
                result.measure_s += (point.summary or {}).get("duration", 0.0)
                steady = point.steady or {}
                if steady.get("life_s") or steady.get("lives"):
                    lives.append((load, max(steady.get("life_s") or 0, steady.get("lives") or 0), point.passed))
                # a first transient at a load is measured again, planned on the life it measured; a second fails
                if not (steady.get("transient") and not any(x == load for x, _ in measured)
                        and sum(p.load == load for p in result.points) == 1):
                    measured.append((load, point.passed))
                if on_point:
                    on_point(point)
                if point.status != "ok" and not server.alive():
                    result.status, result.reason = server.death()
                    break
            else:
                result.status = "running"
    except KeyboardInterrupt:
        result.status, result.reason = "interrupted", "stopped by the user (Ctrl-C)"
        raise
    except Exception as exc:  # noqa: BLE001 - stored, then the next configuration goes on
        result.status, result.reason = runner.record_failure(log_path, exc)
    finally:
        runner.hide_logs(trial.engine, log_path)
        low, high = bracket(measured)
        if result.status == "running":
            result.status = "unbounded" if high is None else "none_passed" if low is None else "ok"
            result.reason = {"unbounded": f"no failing point within max_points={spec.max_points}",
                             "none_passed": f"even {high:g} failed" if high else None}.get(result.status)
        result.low, result.high = low, high
        result.capacity = low if low is not None else (0.0 if high is not None else None)
        broken = holds(result)
        if broken and result.status in SEARCH_DONE:  # cannot happen by construction (loadpoint); never stored silently
            result.status, result.reason = "failed", f"invariant broken: {broken}"
        store.finish_capacity(search_id, result.status, result.reason, capacity=result.capacity, low=low, high=high,
                              points=len(result.points), server_starts=1 if result.start_s is not None else 0,
                              start_s=result.start_s, measure_s=result.measure_s)
    return result


def holds(result: CapacityResult) -> str | None:
    """None when the capacity holds at its own passing point (loadpoint.invariant); else what breaks it."""
    at = [p.steady for p in result.points if p.passed and p.load == result.capacity] or [None]
    return loadpoint.invariant(result.axis, result.capacity, at[-1], result.trial.workload.capacity or Capacity())


def _measure_point(trial: Trial, spec: Capacity, load: float, index: int, fresh_seed: bool, server: engine.Server,
                   store: Store, search_id: str, experiment_path: str | None, machine, gpu_id,
                   progress, life_s: float | None) -> Point:
    pt = loadpoint.point_trial(trial, spec, load, index, fresh_seed, loadpoint.arrival_s(spec, life_s, load))
    begun = runner.begin_run(pt, store, experiment_path, None, machine, gpu_id, search_id=search_id,
                             point_index=index, load_axis=spec.axis, offered_load=load,
                             log_path=str(server.log_path or ""),
                             runs_dir=Path(server.log_path).parent if server.log_path else "runs")
    if begun.held:  # another qwen3lab measures this very point now: not measured twice
        return Point(index, load, begun.run_id, "held", False, None, begun.held, None)
    judge_ = loadpoint.PointJudge(spec, trial.slo, load, life_s, pt.workload.duration_s)
    status, reason, summary, extra, refused, passed, attainment, why = "failed", None, None, {}, [], False, None, ""
    steady = None
    try:
        got = runner.measure(server, pt, store, begun, progress, judge_.add, judge_.stop)
        status, reason, summary, extra, refused = got.status, got.reason, got.summary, got.extra, got.refused
        if status == "ok":
            steady = loadpoint.assess(store.requests([begun.run_id]), store.samples([begun.run_id]), spec,
                                      trial.slo, load, life_s, pt.workload.scrape_interval_s,
                                      None if judge_.early else pt.workload.duration_s)
            if judge_.early:  # ended on a certain failure: what the window shows is added to the judge's reason
                steady["failed"] = sorted({judge_.failed_by, *steady.get("failed", [])}, key=loadpoint.FAILURES.index)
                steady |= {"transient": False, "why": judge_.early}
            attainment, why = steady.get("attainment"), steady["why"]
            passed = not steady["failed"] and not steady["transient"]
        else:
            why = reason or status
        if judge_.early:
            summary |= {"ended_early": judge_.early}
    except KeyboardInterrupt:
        status, reason = "interrupted", "stopped by the user (Ctrl-C)"
        raise
    except EngineError as exc:
        status, reason, why = exc.outcome, exc.reason, exc.reason
    finally:
        point = Point(index, load, begun.run_id, status, passed, attainment, why, summary, steady)
        runner.finish(store, begun, status, reason, summary, {**extra, "attainment": attainment,
                      "point_verdict": point.verdict, "point_why": why, "steady_json": steady}, refused)
    return point


# --- an experiment ----------------------------------------------------------------------------------------
def finished_launches(store: Store, trial: Trial, why: str = "measured earlier") -> list[CapacityResult]:
    """The trial's finished searches (one per server launch), newest first."""
    df = store.capacities(trial_key=trial.key)
    done = df[df.status.isin(SEARCH_DONE + ("skipped",))] if not df.empty else df
    return [resumed_result(trial, row, store, why) for row in done.to_dict("records")]


def stored_capacity(store: Store, trial: Trial, why: str = "measured earlier",
                    unfinished: bool = False) -> CapacityResult | None:
    """The trial's capacity as stored: its newest `capacity.launches` finished searches combined (or its newest
    skip). None while fewer have finished, unless `unfinished`: then the newest search, however it ended."""
    done = finished_launches(store, trial, why)
    need = (trial.workload.capacity or Capacity()).launches
    if done and done[0].status == "skipped":
        return done[0]
    done = [r for r in done if r.status != "skipped"]
    if len(done) >= need:
        return combine(done[:need][::-1])  # in the order they were measured, as capacity_of combines them
    if not unfinished:
        return None
    newest = store.capacities(trial_key=trial.key)
    return None if newest.empty else resumed_result(trial, newest.iloc[0].to_dict(), store, why)


def combined(statuses: list[str], capacities: list[float], lows: list, highs: list) -> tuple:
    """(status, capacity, low, high) of finished searches of one configuration, each on its own launch: the
    median capacity, an interval from the lowest last pass to the highest first failure (open above when a launch
    found no failure)."""
    kinds = set(statuses)
    status = "unbounded" if "unbounded" in kinds else "none_passed" if kinds == {"none_passed"} else "ok"
    known = [x for x in lows if x is not None and x == x]
    top = None if any(x is None or x != x for x in highs) else max(highs)
    return status, statistics.median(capacities), (min(known) if known else None), top


def combine(launches: list[CapacityResult]) -> CapacityResult:
    """Finished searches of one configuration as one result (see `combined`), each launch kept in `launches`."""
    if len(launches) == 1:
        return launches[0]
    first = launches[0]
    status, capacity, low, high = combined([r.status for r in launches], [r.capacity for r in launches],
                                           [r.low for r in launches], [r.high for r in launches])
    return CapacityResult(
        first.trial, first.search_id, first.axis, status,
        f"{len(launches)} launches, capacities " + ", ".join(f"{r.capacity:g}" for r in launches),
        capacity=capacity, low=low, high=high, points=[p for r in launches for p in r.points],
        start_s=sum(r.start_s or 0.0 for r in launches), measure_s=sum(r.measure_s for r in launches),
        launches=launches)


def per_configuration(searches: pd.DataFrame) -> pd.DataFrame:
    """Stored searches (`Store.capacities()`, newest first) as one row per configuration, as `stored_capacity`
    gives it: its newest `launches` finished searches combined (`launches` from its newest search's spec), else
    its newest search as it ended. `launches` counts the finished searches in the row."""
    rows = []
    for _, mine in searches.groupby("trial_key", sort=False):
        spec = mine.iloc[0].spec_json
        need = int((json.loads(spec) if isinstance(spec, str) else spec or {}).get("launches", 1))
        done = mine[mine.status.isin(SEARCH_DONE)].head(need).iloc[::-1]  # in the order they were measured
        if len(done) < need:
            rows.append(mine.iloc[0].to_dict() | {"launches": len(done)})
        elif need == 1:
            rows.append(done.iloc[0].to_dict() | {"launches": 1})
        else:
            status, capacity, low, high = combined(list(done.status), list(done.capacity), list(done.low),
                                                   list(done.high))
            rows.append(done.iloc[0].to_dict() | {
                "status": status, "capacity": capacity, "low": low, "high": high, "points": int(done.points.sum()),
                "start_s": float(done.start_s.sum()), "measure_s": float(done.measure_s.sum()), "launches": need,
                "reason": f"{need} launches, capacities " + ", ".join(f"{c:g}" for c in done.capacity)})
    return pd.DataFrame(rows, columns=[*searches.columns, "launches"])


def capacity_of(trial: Trial, store: Store, runs_dir: str | Path = "runs", experiment_path: str | None = None,
                machine: preflight.Machine | None = None, gpu_id: str | None = None,
                on_point: Callable[[Point], None] | None = None, progress: Callable[[int], None] | None = None,
                verdict: preflight.Verdict | None = None, done: list[CapacityResult] = (),
                on_server: Callable[[engine.Server], None] | None = None) -> CapacityResult:
    """A configuration's capacity over `capacity.launches` fresh launches: those in `done` (finished earlier,
    newest first, as `finished_launches` gives them) count, the rest are measured. A launch that does not finish
    (crash, OOM, skip...) is returned as it ended."""
    need = (trial.workload.capacity or Capacity()).launches
    launches = [r for r in done if r.status in SEARCH_DONE][:need][::-1]  # in the order they were measured
    while len(launches) < need:
        got = measure_capacity(trial, store, runs_dir, experiment_path, machine, gpu_id, on_point=on_point,
                               progress=progress, verdict=verdict, on_server=on_server)
        if got.status not in SEARCH_DONE:
            return got
        launches.append(got)
    return combine(launches)


def told(result: CapacityResult) -> str:
    """A search's outcome as the listener's line says it."""
    return (f"capacity {result.capacity} {result.axis} in [{result.low}, {result.high}]"
            + (f" ({result.reason})" if result.reason else ""))


def told_point(point: Point) -> str:
    return f"at {point.load:g}: {point.verdict} ({point.why})"


def launches_wanted(trial: Trial) -> int:
    return (trial.workload.capacity or Capacity()).launches


def searches_left(store: Store, trial: Trial, retry_failed: bool = False, runnable_here: bool = False,
                  fresh: bool = False) -> tuple[int, tuple[str, str] | None]:
    """(searches this trial still needs for `capacity.launches`, the stored (search_id, status) that stands for
    it: its capacity, or its skip). A trial not runnable here needs one, which stores its skip."""
    want = launches_wanted(trial) if runnable_here else 1
    if fresh:
        return want, None
    stored = stored_capacity(store, trial)
    if stored is not None:
        return 0, (stored.search_id, stored.status)
    finished = [r for r in finished_launches(store, trial) if r.status in SEARCH_DONE]
    return max(want - len(finished), 1), None


# A capacity launch: one server, one search (measure_capacity); schedule.Schedule orders them as it orders runs.
SEARCHES = schedule.Kind("capacity search", launches_wanted, searches_left)


def run_capacities(path: str | Path, db: str, only: list[str] | None = None, runs_dir: str | Path = "runs",
                   fresh: bool = False, listener: Listener | None = None) -> list[CapacityResult]:
    """The capacity of every trial of an experiment (or of `only` chapters), with resume; pre-flight first.
    A trial's `capacity.launches` searches are interleaved with the other trials' (A B A B), as runs are."""
    listener = listener or Listener()
    planned = executor.plan(path, only)
    planned.raise_errors()
    store = Store(db)
    failed: dict[str, CapacityResult] = {}
    with campaign.opened(store, "capacity", path, {"only": only, "fresh": fresh}):
        sched = schedule.Schedule(planned, store, lambda *_: None, fresh=fresh, listener=listener, kind=SEARCHES)
        while (launch := sched.next()) is not None:
            trial = launch.trial
            if trial.key in failed:  # a launch that did not finish ends the trial: no more servers for it
                sched.finished(launch, runner.TrialResult(trial, "", "skipped", "an earlier launch failed"))
                continue
            listener.launching(trial, f"starting its server{launch.label}")
            got = measure_capacity(trial, store, runs_dir, str(path), planned.machine, planned.experiment.gpu,
                                   on_point=lambda p, t=trial: listener.point(t, told_point(p)),
                                   progress=lambda n, t=trial: listener.requests_done(t, n), verdict=launch.verdict)
            if got.status not in SEARCH_DONE + ("skipped",):
                failed[trial.key] = got
            listener.finished(trial, got.status, told(got))
            sched.finished(launch, runner.TrialResult(trial, got.search_id, got.status, got.reason))
    # a launch that did not finish stands for its trial, else its launches combined (or its skip)
    results = [failed.get(v.trial.key) or stored_capacity(store, v.trial, unfinished=True) for v in planned.verdicts]
    return [r for r in results if r is not None]


def resumed_result(trial: Trial, row: dict, store: Store, why: str = "measured earlier") -> CapacityResult:
    """A stored search (a `capacities` row and its points) as the result it was."""
    points = stored_points(store.capacity_points([row["search_id"]]), why)
    nan = lambda v: None if v is None or v != v else float(v)  # noqa: E731
    return CapacityResult(trial, row["search_id"], row["axis"], row["status"], row.get("reason"),
                          nan(row.get("capacity")), nan(row.get("low")), nan(row.get("high")), points,
                          nan(row.get("start_s")), nan(row.get("measure_s")) or 0.0)


def stored_points(pts: pd.DataFrame, why: str = "measured earlier") -> list[Point]:
    """Stored load points (`Store.capacity_points`) as the Points they were (`Point.row` shows one)."""
    steady = pts.steady_json if "steady_json" in pts else [None] * len(pts)  # stores of before the steady window
    told = pts.point_why if "point_why" in pts else [None] * len(pts)
    return [Point(int(r.point_index), float(r.offered_load), r.run_id, r.status, r.point_verdict == "pass",
                  None if r.attainment != r.attainment else float(r.attainment),
                  w if isinstance(w, str) else why,
                  {"p95_ttft_ms": r.p95_ttft_ms, "p95_tpot_ms": r.p95_tpot_ms, "request_goodput": r.request_goodput},
                  json.loads(st) if isinstance(st, str) else None)
            for r, st, w in zip(pts.itertuples(), steady, told)] if not pts.empty else []
