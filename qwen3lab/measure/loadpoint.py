"""One load point of a capacity search: its plan and workload, the judge on its load, and its verdict on its
steady state (design: "Capacity is a steady state").

Arrivals last `arrival_s`: the longest of `min_arrival_s`, `arrival_lifetimes` x one request's life (the median
E2EL, from the previous point; the first point plans with min_arrival_s and measures its own) and, open loop, the
ramp-up, the tail and a window long enough to resolve flow_tolerance (`flow_window_s`). The steady window,
in arrival time, is [ramp_lifetimes x life, last arrival - life]: requests that arrive during the ramp-up (a
closed loop's opening burst among them) and those still in flight when arrivals stop are stored, judged apart.
On the window a point fails by
- flow: completed requests fall short of arriving ones by more than flow_tolerance (plus the noise of the
  requests in flight at the window's ends, `allowed_shortfall`);
- queue: vLLM's waiting + running requests, or the client's own in-flight count, grow through the window: the
  least-squares slope over time is positive at one-sided p < trend_alpha (Student's t on n - 2 degrees of
  freedom) and its rise over the window exceeds flow_tolerance of the window's arrivals (a queue that grew by
  that many requests is that share of the flow not served);
- slo: attainment below min_attainment (criterion percentiles: the SLO percentiles of the window's requests).
A point that would pass but whose arrivals lasted fewer than arrival_lifetimes lives (the longer of the life it was
planned on and its own), or whose window is too short for its flow test to resolve flow_tolerance, is `transient`: stored, it never decides a capacity (the search measures that load again, planned on the life it measured).
The invariant: a capacity's passing point served goodput of at least capacity x min_attainment x (1 -
flow_tolerance), less the Poisson noise of its window's arrivals (`floor_goodput`, `invariant`); an open-loop point
that did not is failed by flow, so no such capacity is stored.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from qwen3lab.analysis import metrics
from qwen3lab.experiment.spec import SLO, Capacity, Trial, Workload

QUEUE = ("vllm:num_requests_waiting", "vllm:num_requests_running")
FAILURES = ("flow", "queue", "slo")  # what a point's verdict names, in this order
SEED_STRIDE = 1009  # a fresh prompt seed per point: seed + index * stride


def arrival_s(spec: Capacity, life_s: float | None, load: float | None = None) -> float:
    """How long a point's arrivals last, planned on one request's life (None: not known yet), at most
    max_arrival_s: the longest of min_arrival_s, arrival_lifetimes lives, and the ramp-up, the tail and a window
    long enough to resolve the flow tolerance at this load (`flow_window_s`)."""
    if life_s is None:
        planned = spec.min_arrival_s
    else:
        resolving = PLAN_HEADROOM * ((spec.ramp_lifetimes + 1) * life_s + flow_window_s(spec, load, life_s)) \
            if load and spec.axis == "request_rate" else 0.0
        planned = max(spec.min_arrival_s, spec.arrival_lifetimes * life_s, resolving)
    return min(planned, spec.max_arrival_s or planned)


# The resolving window is planned this much longer than the life below it asks: a higher load's requests live longer
# and its window's Poisson arrivals may run below the rate offered. Planned on the bare figure, the 2-core VM's
# points missed it by 0-25% ("a 9 s window of 12 arrivals ... need a 11 s window") and each load was measured twice.
PLAN_HEADROOM = 1.5


def in_flight_noise(spec: Capacity, rate: float, life_s: float) -> float:
    """Completions a window may miss by chance alone: the requests in flight at its two ends (Little's law: rate x
    life on average, Poisson-spread, so their difference has sd sqrt(2 x rate x life)) at the trend test's
    one-sided significance."""
    from scipy import stats

    return float(stats.norm.isf(spec.trend_alpha)) * math.sqrt(2 * rate * life_s)


def flow_window_s(spec: Capacity, rate: float, life_s: float) -> float:
    """The shortest steady window whose in-flight noise is at most flow_tolerance of its arrivals: shorter, a
    shortfall of flow_tolerance cannot be told from chance, and the flow test has no power (a 5 s window of 6
    arrivals on the 2-core VM passed serving half of them)."""
    return in_flight_noise(spec, rate, life_s) / (spec.flow_tolerance * rate) if rate > 0 else 0.0


# A transient point measured again is planned on this many times the life it measured: near saturation a longer
# window lets the queue grow, so the life grows with it (on the 2-core VM 1.66 s became 2.71 s, 1.60 s 2.45 s), and a
# repeat planned on the measured life alone was transient a second time.
REPEAT_HEADROOM = 2.0


def planned_life(lives: list[tuple[float, float, bool]], load: float) -> float | None:
    """The request life a point at `load` is planned on: REPEAT_HEADROOM x that measured at this very load (a
    transient point measured again), else that of the highest passing load below it, else the shortest measured (a
    failing point's life is mostly its queue), else None (the point measures its own)."""
    here = [life for x, life, _ in lives if x == load]
    if here:
        return REPEAT_HEADROOM * max(here)
    below = [(x, life) for x, life, ok in lives if ok and x <= load]
    return max(below)[1] if below else min((life for _, life, _ in lives), default=None)


def point_workload(workload: Workload, spec: Capacity, load: float, index: int, fresh_seed: bool,
                   seconds: float | None = None) -> Workload:
    """The workload of one point: the load on its axis, the other axis open, arrivals for `seconds` (default:
    `arrival_s` with no life known), its own warm-up (and seed). The first point also sends the trial's
    own warm-up: it meets a server that has just started (a cold CPU vLLM answered its first dozen requests at
    10-20x the TTFT of later ones, and failed a point that later passed)."""
    seconds = seconds or arrival_s(spec, None)
    update = {"capacity": None, "duration_s": seconds,
              "warmup_requests": spec.warmup_per_point + (workload.warmup_requests if index == 0 else 0),
              "seed": workload.seed + index * SEED_STRIDE if fresh_seed else workload.seed}
    if spec.axis == "request_rate":  # open loop: a queue shows up as latency; the requests follow from rate x time
        update |= {"request_rate": float(load), "concurrency": None, "num_requests": math.ceil(load * seconds) + 1}
    elif spec.axis == "time_scale":  # a trace replayed faster (open loop, its own times), in turn until the end
        update |= {"concurrency": None, "request_rate": None,
                   "source": {**workload.source.model_dump(), "time_scale": float(load)}}
    else:  # closed loop: its distinct requests, sent in turn until the arrivals end
        update |= {"concurrency": int(load), "request_rate": None,
                   "num_requests": spec.requests_per_point or workload.num_requests}
    return Workload.model_validate(workload.model_dump() | update)


def point_trial(trial: Trial, spec: Capacity, load: float, index: int, fresh_seed: bool,
                seconds: float | None = None) -> Trial:
    label = f"{load:g}"
    return trial.model_copy(update={
        "name": f"{trial.name}@{spec.axis}={label}",
        "workload": point_workload(trial.workload, spec, load, index, fresh_seed, seconds),
        "tags": {**trial.tags, "capacity_of": trial.name}, "baseline": None})


@dataclass
class Trend:
    slope: float  # requests per second
    p: float  # one-sided: the chance of a slope this large if the queue did not grow
    rise: float  # the fitted growth over the series' span, in requests
    n: int

    def grows(self, arrivals: float, spec: Capacity) -> bool:
        return self.p < spec.trend_alpha and self.rise > spec.flow_tolerance * max(arrivals, 1.0)


def trend(t, y) -> Trend | None:
    """Least-squares line of y on t, with its slope's one-sided t test; None with fewer than 3 distinct times."""
    from scipy import stats

    t, y = np.asarray(t, dtype=float), np.asarray(y, dtype=float)
    tc = t - t.mean() if len(t) else t
    sxx = float((tc ** 2).sum())
    if len(t) < 3 or sxx <= 0:
        return None
    slope = float((tc * (y - y.mean())).sum() / sxx)
    resid = y - y.mean() - slope * tc
    se = math.sqrt(float((resid ** 2).sum()) / (len(t) - 2) / sxx)
    p = float(stats.t.sf(slope / se, len(t) - 2)) if se > 0 else (0.0 if slope > 0 else 1.0)
    return Trend(slope, p, slope * float(t.max() - t.min()), len(t))


def server_queue(samples: pd.DataFrame, start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
    """(t, waiting + running) of vLLM's scrapes within [start, end] (every server behind a router summed)."""
    if samples is None or samples.empty:
        return np.array([]), np.array([])
    s = samples[samples.name.isin(QUEUE) & (samples.t >= start) & (samples.t <= end)]
    total = s.groupby("t").value.sum()
    return total.index.to_numpy(dtype=float), total.to_numpy(dtype=float)


def client_in_flight(sent: np.ndarray, ended: np.ndarray, start: float, end: float, step_s: float):
    """(t, requests the client had sent and not yet seen end) on a grid over [start, end]."""
    grid = np.arange(start, end + 1e-9, step_s)
    return grid, ((sent[None, :] <= grid[:, None]) & (ended[None, :] > grid[:, None])).sum(axis=1).astype(float)


def assess(rows: pd.DataFrame, samples: pd.DataFrame | None, spec: Capacity, slo: SLO, load: float,
           life_s: float | None, scrape_s: float = 1.0, planned_s: float | None = None) -> dict:
    """The steady-state verdict of a measured point from its stored rows: offered and served rate, the window,
    both queue trends, attainment, which of flow / queue / slo failed, the validity. `life_s`: the life the point
    was planned on (None: its own median E2EL); `planned_s`: how long its arrivals were planned to last, when it
    ran to their end (the last Poisson arrival comes before it, by chance)."""
    table = metrics.request_table(rows)
    sent = rows.sent_at.to_numpy(dtype=float)
    e2el = np.nan_to_num(rows.e2el.to_numpy(dtype=float), nan=0.0)  # a request failed at once ends when sent
    ended = sent + e2el
    own_life = float(np.median(table.e2el[table.ok])) if table.ok.any() else None
    life = life_s or own_life or 0.0
    last = max(float(sent.max()) if len(sent) else 0.0, planned_s or 0.0)
    start, end = spec.ramp_lifetimes * life, last - life
    out = {"life_s": own_life, "planned_life_s": life_s, "arrival_s": last, "window": [start, end],
           "steady_s": max(end - start, 0.0)}
    inside = (sent >= start) & (sent <= end)
    if end <= start or not inside.any():
        out |= {"failed": [], "why": f"transient: arrivals lasted {last:.1f} s, a request lives {life:.2f} s "
                f"(no steady window after {spec.ramp_lifetimes:g} lives of ramp-up)", "transient": True}
        return out
    span = end - start
    good = np.zeros(len(table), dtype=bool)
    good[table.ok] = table.good(metrics.per_request_slo(slo))
    done = table.ok & (ended >= start) & (ended <= end)
    arrivals = int(inside.sum())
    out |= {"judged": arrivals, "offered_rate": arrivals / span, "served_rate": float(done.sum()) / span,
            "goodput_rate": float((done & good).sum()) / span, "attainment": float(good[inside].mean())}
    queues = {"server": trend(*server_queue(samples, start, end)),
              "client": trend(*client_in_flight(sent, ended, start, end, scrape_s))}
    out["queue_trend"] = {k: None if v is None else {"slope": v.slope, "p": v.p, "rise": v.rise, "n": v.n}
                          for k, v in queues.items()}
    failed = []
    if arrivals - int(done.sum()) > allowed_shortfall(spec, arrivals, out["offered_rate"], life) or \
            (spec.axis == "request_rate" and out["goodput_rate"] < floor_goodput(spec, load, span)):
        failed.append("flow")
    if any(v is not None and v.grows(arrivals, spec) for v in queues.values()):
        failed.append("queue")
    if spec.criterion == "percentiles":
        slo_ok = metrics.meets_slo(metrics.summarize(table.take(np.flatnonzero(inside)), span, slo), slo)
    else:
        slo_ok = out["attainment"] >= spec.min_attainment
    if not slo_ok:
        failed.append("slo")
    out["failed"] = failed
    # the longer of the planned life and its own: a window planned on a short life is no longer a steady state
    lives = max(life, own_life or 0.0)
    # and an open loop's window whose in-flight noise is more than flow_tolerance of its arrivals cannot show its
    # flow held (a closed loop keeps its in-flight count fixed: its flow is not in doubt, its latency is)
    unresolved = spec.axis == "request_rate" and \
        in_flight_noise(spec, out["offered_rate"], lives) > spec.flow_tolerance * arrivals
    out["transient"] = not failed and (last < spec.arrival_lifetimes * lives or unresolved)
    out["lives"] = lives
    if unresolved:
        out["flow_window_s"] = flow_window_s(spec, out["offered_rate"], lives)
    out["why"] = describe(out, spec, load)
    return out


def allowed_shortfall(spec: Capacity, arrivals: int, rate: float, life_s: float) -> float:
    """Requests a steady window may complete fewer than arrive in it: flow_tolerance of its arrivals, plus the
    in-flight noise at its two ends. A window too short for the noise to fit inside the tolerance passes nothing
    (`assess`: transient); a long one is held to flow_tolerance."""
    return spec.flow_tolerance * arrivals + in_flight_noise(spec, rate, life_s)


def floor_goodput(spec: Capacity, load: float, span_s: float) -> float:
    """The least goodput a passing open-loop point may serve over a window of span_s, what makes `invariant` hold
    by construction: load x min_attainment x (1 - flow_tolerance), less the Poisson noise of the window's arrivals
    at the trend test's significance (one-sided z at trend_alpha x sqrt(load x span) / span): a short window is
    allowed its own sampling noise and no more."""
    from scipy import stats

    noise = float(stats.norm.isf(spec.trend_alpha)) * math.sqrt(load * span_s) / span_s if span_s > 0 else 0.0
    return load * spec.min_attainment * (1 - spec.flow_tolerance) - noise


def describe(out: dict, spec: Capacity, load: float) -> str:
    flows = (f"served {out['served_rate']:.3g} of {out['offered_rate']:.3g} req/s offered, goodput "
             f"{out['goodput_rate']:.3g} over a {out['steady_s']:.0f} s window")
    rises = [f"{k} queue +{v['rise']:.1f} (p={v['p']:.2g})" for k, v in out["queue_trend"].items() if v]
    att = f"attainment {out['attainment']:.3f} (need {spec.min_attainment:g})"
    if out["failed"]:
        return f"failed by {' and '.join(out['failed'])}: {flows}; {att}; " + ", ".join(rises)
    if out["transient"] and out["arrival_s"] < spec.arrival_lifetimes * out["lives"]:
        return (f"transient: arrivals lasted {out['arrival_s']:.1f} s, a request lives {out['lives']:.2f} s "
                f"(need {spec.arrival_lifetimes:g} lives)")
    if out["transient"]:
        return (f"transient: a {out['steady_s']:.0f} s window of {out['judged']} arrivals cannot tell a "
                f"{spec.flow_tolerance:.0%} shortfall from the requests in flight at its ends (need a "
                f"{out['flow_window_s']:.0f} s window)")
    return f"steady: {flows}; {att}"


def invariant(axis: str, capacity: float | None, point: dict | None, spec: Capacity) -> str | None:
    """None when a capacity holds at its own passing point (an open loop's: the goodput there is at least
    floor_goodput: capacity x min_attainment x (1 - flow_tolerance), less the window's Poisson noise); else what
    breaks it."""
    if capacity is None or capacity == 0 or axis != "request_rate":
        return None  # no capacity, or a closed loop's (a concurrency: its flow is checked at the point)
    if not point or point.get("transient") or point.get("failed") or "goodput_rate" not in point:
        return f"capacity {capacity:g} stands on a point without a steady pass"
    floor = floor_goodput(spec, capacity, point["steady_s"])
    if point["goodput_rate"] < floor - 1e-9:
        return (f"capacity {capacity:g} req/s above the goodput its passing point served: {point['goodput_rate']:.3g} "
                f"< {floor:.3g} ({capacity:g} x {spec.min_attainment:g} x (1 - {spec.flow_tolerance:g}), less the "
                f"Poisson noise of a {point['steady_s']:.0f} s window)")
    return None


class PointJudge:
    """On the load's loop: counts misses among the window's requests, and watches vLLM's queue; says when a point
    has failed for certain, so it ends early (by slo, or by queue growth)."""

    def __init__(self, spec: Capacity, slo: SLO, load: float, life_s: float | None, planned_s: float):
        self.spec, self.load, self.life_s, self.planned_s = spec, load, life_s, planned_s
        self.request_slo = metrics.per_request_slo(slo)
        life = life_s or 0.0
        # requests expected in the window (a closed loop's rate: Little's law on the planned life); a miss
        # beyond the share allowed of them decides the point
        rate = load if spec.axis == "request_rate" else (load / life if life and spec.axis == "concurrency" else 0.0)
        expected = rate * max(planned_s - (spec.ramp_lifetimes + 1) * life, 0)
        self.allowed_misses = math.floor((1 - spec.min_attainment) * expected + 1e-9) if expected else None
        self.misses = 0
        self.lives: list[float] = []
        self.t0: float | None = None
        self.checked_at = 0.0
        self.early: str | None = None
        self.failed_by: str | None = None

    def life(self) -> float | None:
        """The planned life, else the median of the first lives seen (from five on)."""
        return self.life_s or (statistics.median(self.lives) if len(self.lives) >= 5 else None)

    def ramp_s(self) -> float | None:
        life = self.life()
        return None if life is None else self.spec.ramp_lifetimes * life

    def add(self, rec) -> None:
        if rec.warmup:
            return
        if rec.ok and rec.e2el is not None:
            self.lives.append(rec.e2el)
        ramp = self.ramp_s()
        # only the window's requests count: not the ramp-up's, nor the tail's (the last life of arrivals)
        if ramp is None or not ramp <= rec.sent_at <= self.planned_s - self.life() or \
                self.spec.criterion != "attainment":
            return
        # Light on purpose (this runs on the load's event loop): numpy on one row, no DataFrame.
        one = metrics.RequestTable.from_columns(
            ok=[rec.ok], ttft=[rec.ttft], e2el=[rec.e2el], prompt_tokens=[0], chunk_times=[None], request_class=[""],
            output_tokens=[rec.output_tokens if rec.output_tokens is not None else len(rec.chunk_times)])
        if not (rec.ok and bool(one.good(self.request_slo).all())):
            self.misses += 1

    def stop(self, samples: list) -> bool:
        now = time.perf_counter()
        if self.t0 is None:  # first asked when the measured load opens: the origin of its send times
            self.t0 = now
        if self.early:
            return True
        if self.allowed_misses is not None and self.misses > self.allowed_misses:
            self.early, self.failed_by = (f"failed by slo, early: {self.misses} requests of the window missed "
                                          f"the SLOs, {self.allowed_misses} allowed"), "slo"
        elif now - self.checked_at >= 1.0 and (ramp := self.ramp_s()) is not None:
            self.checked_at = now  # the trend at most once a second: the loop reads streams meanwhile
            t = [s[0] - self.t0 for s in samples if s[2] in QUEUE]
            got = server_queue(pd.DataFrame({"t": t, "name": [s[2] for s in samples if s[2] in QUEUE],
                                             "value": [s[3] for s in samples if s[2] in QUEUE]}), ramp, now - self.t0)
            tr = trend(*got)
            # open loop: arrivals are known; a closed loop's queue is bounded by its cap and shows up in TTFT
            arrivals = self.load * (now - self.t0 - ramp)
            if self.spec.axis == "request_rate" and tr is not None and tr.n >= 10 and tr.grows(arrivals, self.spec):
                self.early, self.failed_by = (f"failed by queue, early: vLLM's waiting + running requests grew by "
                                              f"{tr.rise:.0f} in {now - self.t0 - ramp:.0f} s (p={tr.p:.2g})"), "queue"
        return self.early is not None
