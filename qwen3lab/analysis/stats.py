"""Statistics over launches: a trial's figure is the mean of its launch figures; tests between trials are t tests
on those launch figures, small-sample correct (docs/statistics.md has the method and its references).

A launch (one `vllm serve` start and its load) is the unit of replication: two launches of one configuration
differ by 5-10% in throughput, more than the noise between requests inside one launch. With 2 launches a trial,
a bootstrap over launches can only draw {launch 1, launch 2} and never sees how far a third would land; Student's
t on the launch figures does (at 95% with 1 degree of freedom its quantile is 12.71, not 1.96).

- A trial: n launch figures m_i, each with its within-launch standard error w_i (a block bootstrap of its
  requests). The variance of one launch is s^2 (the launch figures' sample variance, n - 1 df) floored by mean(w_i^2):
  two launches that happen to agree cannot claim less noise than each launch's own requests carry.
- Two trials: Welch's t on the launch figures (Welch 1947), df by Welch-Satterthwaite from each side's n - 1.
- One launch on either side: the spread between launches is unknown; the verdict says "one launch", never
  better or worse (its interval holds only the noise inside the launches, with a normal quantile).
- Several comparisons (a chapter's trials x metrics; the winner against every other trial, since it was picked
  as the best of N) are corrected with Holm's step-down method (Holm 1979).
- "Can't tell" says what it would take: the smallest difference these launches detect at 80% power, and about
  how many launches a trial would need to detect the difference observed.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

LEVEL = 0.95
POWER = 0.80  # for "what it would take": the chance to detect a difference of the size named
MAX_BLOCKS = 50
MAX_LAUNCHES = 1000  # "launches needed" above this reads as "more than 1000"
ONE_LAUNCH = "one launch: launch-to-launch spread unknown"


@dataclass
class Interval:
    """A difference (or a figure) with its confidence interval, the two-sided p-value of 'zero', and what it took.

    df: the t distribution's degrees of freedom (inf: one launch a side, a normal quantile on the within-launch
    noise alone); launches: (a's, b's); detectable: the smallest difference these launches detect at 80% power;
    needed: about how many launches a trial would need to detect the observed difference (inf: more than 1000)."""

    estimate: float
    low: float
    high: float
    p_value: float = float("nan")
    se: float = float("nan")
    df: float = float("nan")
    launches: tuple[int, int] = (0, 0)
    detectable: float = float("nan")
    needed: float = float("nan")
    level: float = LEVEL

    @property
    def ci(self) -> str:
        """'95% CI', or the level Holm's step gave the comparison ('97.5% CI')."""
        return f"{self.level * 100:.4g}% CI"

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    @property
    def one_launch(self) -> bool:
        return min(self.launches) < 2


NAN = Interval(float("nan"), float("nan"), float("nan"))


@dataclass
class Launch:
    """One launch's rows: `units` (one row per resampling unit: a block of requests, or a request) and its scale."""

    units: np.ndarray  # (n_units, columns)
    scale: float = 1.0  # rates: mean concurrency (summed latency / duration), see compare's module doc


Statistic = Callable[[np.ndarray, float], np.ndarray]  # (draws, n_units, columns), scale -> (draws,)


@dataclass
class Figures:
    """One trial: each launch's figure and its within-launch standard error."""

    values: np.ndarray
    within_se: np.ndarray

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @property
    def launch_var(self) -> float:
        """Variance of one launch's figure: the launches' sample variance, floored by the within-launch noise."""
        within = float(np.mean(self.within_se ** 2))
        return max(float(np.var(self.values, ddof=1)), within) if self.n > 1 else within


def block_size(n_requests: int) -> int:
    """About sqrt(n) consecutive requests a block: long enough to keep a slow stretch slow, enough blocks to draw."""
    return int(np.clip(round(np.sqrt(max(n_requests, 1))), 1, MAX_BLOCKS))


def _draws(launch: Launch, stat: Statistic, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """stat of `launch` under n_boot resamples of its units with replacement (memory bounded for large launches)."""
    n = len(launch.units)
    out = np.empty(n_boot)
    chunk = max(1, 4_000_000 // max(launch.units.size, 1))
    for s in range(0, n_boot, chunk):
        idx = rng.integers(0, n, size=(min(chunk, n_boot - s), n))
        with np.errstate(divide="ignore", invalid="ignore"):
            out[s:s + len(idx)] = stat(launch.units[idx], launch.scale)
    return out


def figures(launches: Sequence[Launch], stat: Statistic, n_boot: int = 400, seed: int = 0) -> Figures:
    """Each launch's figure (stat on all its units) and its within-launch standard error (bootstrap of its units)."""
    rng = np.random.default_rng(seed)
    values, se = [], []
    for x in launches:
        with np.errstate(divide="ignore", invalid="ignore"):
            values.append(float(stat(x.units[None], x.scale)[0]))
        d = _draws(x, stat, n_boot, rng)
        d = d[np.isfinite(d)]
        se.append(float(np.std(d, ddof=1)) if len(d) > 1 else float("nan"))
    return Figures(np.array(values), np.array(se))


def _quantile(level: float, df: float) -> float:
    return float(sps.norm.ppf(level) if not np.isfinite(df) else sps.t.ppf(level, df))


def _p(t_value: float, df: float) -> float:
    return float(2 * (sps.norm.sf(abs(t_value)) if not np.isfinite(df) else sps.t.sf(abs(t_value), df)))


def _welch_df(va: float, dfa: float, vb: float, dfb: float) -> float:
    """Welch-Satterthwaite degrees of freedom of va + vb (each a variance of a mean with its own df)."""
    if va + vb == 0:
        return min(dfa, dfb)
    return (va + vb) ** 2 / (va ** 2 / dfa + vb ** 2 / dfb)


def detectable(se: float, df: float, alpha: float = 1 - LEVEL, power: float = POWER) -> float:
    """The smallest true difference a two-sided t test at `alpha` finds with probability `power`."""
    return (_quantile(1 - alpha / 2, df) + _quantile(power, df)) * se


def launches_needed(diff: float, a: Figures, b: Figures, alpha: float = 1 - LEVEL, power: float = POWER) -> float:
    """About how many launches each trial would need for a Welch test at `alpha` to detect `diff` with `power`,
    if their launches spread as the ones measured (inf: more than MAX_LAUNCHES)."""
    sa, sb = a.launch_var, b.launch_var
    if not np.isfinite(diff) or diff == 0 or not np.isfinite(sa + sb):
        return float("inf")
    for n in range(2, MAX_LAUNCHES + 1):
        v = (sa + sb) / n
        if detectable(np.sqrt(v), _welch_df(sa / n, n - 1, sb / n, n - 1), alpha, power) <= abs(diff):
            return float(n)
    return float("inf")


def welch(a: Figures, b: Figures, relative: bool = False, level: float = LEVEL) -> Interval:
    """mean(a) - mean(b) (or mean(a)/mean(b) - 1 in percent) with Welch's t interval over launch figures.

    One launch on either side: no launch spread is known; the interval is the within-launch noise with a normal
    quantile, and `one_launch` says so (verdicts never call it better or worse)."""
    if not a.n or not b.n:
        return NAN
    ma, mb = a.mean, b.mean
    va, vb = a.launch_var / a.n, b.launch_var / b.n
    one = min(a.n, b.n) < 2
    df = float("inf") if one else _welch_df(va, a.n - 1, vb, b.n - 1)
    diff, se = ma - mb, float(np.sqrt(va + vb))
    if not np.isfinite(diff) or not np.isfinite(se):
        return Interval(diff, float("nan"), float("nan"), launches=(a.n, b.n))
    alpha = 1 - level
    p = _p(diff / se, df) if se > 0 else float(diff == 0)
    need = float("nan") if one else launches_needed(diff, a, b, alpha)
    if relative:  # delta method: the ratio's standard error from both means' variances
        with np.errstate(divide="ignore", invalid="ignore"):
            est = (ma / mb - 1) * 100
            se = abs(ma / mb) * np.sqrt(va / ma ** 2 + vb / mb ** 2) * 100 if ma else np.sqrt(va) / abs(mb) * 100
    else:
        est = diff
    half = _quantile(1 - alpha / 2, df) * se
    mdd = float("nan") if one else detectable(se, df, alpha)
    return Interval(float(est), float(est - half), float(est + half), p, float(se), df, (a.n, b.n), mdd, need, level)


def trial_interval(f: Figures, level: float = LEVEL) -> Interval:
    """A trial's figure with its t interval over launches (n - 1 df; one launch: the within-launch noise)."""
    if not f.n:
        return NAN
    se = float(np.sqrt(f.launch_var / f.n))
    df = f.n - 1 if f.n > 1 else float("inf")
    half = _quantile(1 - (1 - level) / 2, df) * se
    return Interval(f.mean, f.mean - half, f.mean + half, se=se, df=df, launches=(f.n, f.n), level=level)


def trend(at_s: np.ndarray, f: Figures, relative: bool = True, level: float = LEVEL) -> Interval:
    """The change from the first to the last time point along a least-squares line through the figures (windows
    of a soak): t with n - 2 df, the residual variance floored by the within-window noise; relative: in percent
    of the line's first value. Fewer than three points: no spread beyond the line is known (one_launch)."""
    t = np.asarray(at_s, dtype=float)
    n = len(t)
    if n < 2:
        return NAN
    slope, icpt = np.polyfit(t, f.values, 1)
    span = t.max() - t.min()
    sxx = float(((t - t.mean()) ** 2).sum())
    within = float(np.mean(f.within_se ** 2))
    resid = float(((f.values - (icpt + slope * t)) ** 2).sum() / (n - 2)) if n > 2 else 0.0
    se = float(np.sqrt(max(resid, within) / sxx)) * span
    df = float(n - 2) if n > 2 else float("inf")
    change = float(slope * span)
    scale = 100 / (icpt + slope * t.min()) if relative else 1.0
    p = _p(change / se, df) if se > 0 else float(change == 0)
    half = _quantile(1 - (1 - level) / 2, df) * se
    mdd = detectable(se, df, 1 - level) * abs(scale) if n > 2 else float("nan")
    est = change * scale
    return Interval(est, est - half * abs(scale), est + half * abs(scale), p, se * abs(scale), df,
                    (n - 1, n - 1), mdd, level=level)


def holm(p_values: Sequence[float], alpha: float = 1 - LEVEL) -> np.ndarray:
    """Holm's step-down: which of the hypotheses are rejected at family-wise error `alpha` (NaN: never)."""
    p = np.asarray(p_values, dtype=float)
    reject = np.zeros(len(p), dtype=bool)
    finite = np.flatnonzero(np.isfinite(p))
    order = finite[np.argsort(p[finite], kind="stable")]
    m = len(order)
    for rank, i in enumerate(order):
        if p[i] > alpha / (m - rank):
            break
        reject[i] = True
    return reject


def holm_levels(p_values: Sequence[float], alpha: float = 1 - LEVEL) -> np.ndarray:
    """The error level Holm's step-down tests each hypothesis at (alpha / (m - rank)); NaN (not tested, e.g. one
    launch): alpha itself."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(len(p), alpha)
    finite = np.flatnonzero(np.isfinite(p))
    for rank, i in enumerate(finite[np.argsort(p[finite], kind="stable")]):
        out[i] = alpha / (len(finite) - rank)
    return out


def best_of(winner: Figures, others: Sequence[Figures], level: float = LEVEL) -> tuple[list[Interval], list[bool]]:
    """The picked best of N against every other trial: Welch intervals, each at the level Holm's step-down tests
    it, and, for each, whether the best is ahead of it (Holm rejected, difference positive). The best is
    confidently best only when it is ahead of all of them."""
    alpha = 1 - level
    plain = [welch(winner, o, level=level) for o in others]
    ps = [np.nan if iv.one_launch else iv.p_value for iv in plain]
    ivs = [welch(winner, o, level=1 - a) for o, a in zip(others, holm_levels(ps, alpha))]
    return ivs, [bool(s) and iv.estimate > 0 for s, iv in zip(holm(ps, alpha), ivs)]


def verdict(iv: Interval, higher_is_better: bool, confident: bool) -> str:
    """better / worse / can't tell; one launch on either side: 'one launch', never better or worse."""
    if iv.one_launch:
        return ONE_LAUNCH
    if not confident or not np.isfinite(iv.estimate):
        return "can't tell"
    return "better" if (iv.estimate > 0) == higher_is_better else "worse"


def would_take(iv: Interval, unit: str = "", fmt: str = "{:.2f}") -> str:
    """What a "can't tell" would need, in words: the smallest difference these launches detect (80% power) and
    about how many launches a trial would need to detect the one observed."""
    if iv.one_launch or not np.isfinite(iv.detectable):
        return "launch each trial at least twice to know how far launches spread"
    u = f" {unit}" if unit else ""
    need = ("more than " + str(MAX_LAUNCHES) if not np.isfinite(iv.needed) else f"about {iv.needed:.0f}")
    return (f"these launches detect a difference of {fmt.format(iv.detectable)}{u} or more (80% power); "
            f"to detect the {fmt.format(abs(iv.estimate))}{u} observed, {need} launches a trial")
