"""Statistics over launches: a trial's estimate pools its launches, its interval resamples launches, then blocks.

A launch (one `vllm serve` start and its load) is the unit of replication: two launches of one configuration
differ by 5-10% in throughput, more than the noise between requests inside one launch. So an interval is a
two-stage (hierarchical) bootstrap: draw the trial's launches with replacement, then, within each drawn launch,
its blocks of consecutive requests with replacement. With one launch the first stage has nothing to draw:
the interval then holds only the noise inside that launch, and every verdict says the launch-to-launch
spread is unknown.

When two trials sent the identical requests (same requests digest, same count), the inner resample draws the
same blocks on both sides (paired), which removes the noise the request mix itself contributes.

A trial's figure is the mean over its launches of the launch's figure (rates, and P95 TTFT alike), so one
launch gives exactly the run's own number.

Verdicts over many comparisons (a chapter's trials x metrics) are corrected with Holm's step-down method on
bootstrap p-values, so "better" over twelve comparisons is not twelve chances at 5%.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
MAX_BLOCKS = 50


@dataclass
class Interval:
    """A point estimate with a bootstrap confidence interval and the bootstrap two-sided p-value of 'zero'."""

    estimate: float
    low: float
    high: float
    p_value: float = float("nan")

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


@dataclass
class Launch:
    """One launch's rows for the bootstrap: `units` (one row per resampling unit), its digest and its scale."""

    units: np.ndarray  # (n_units, columns)
    digest: str | None
    scale: float = 1.0  # rates: mean concurrency (summed latency / duration), see compare's module doc


Statistic = Callable[[np.ndarray, float], np.ndarray]  # (draws, n_units, columns), scale -> (draws,)


def block_size(n_requests: int) -> int:
    """About sqrt(n) consecutive requests a block: long enough to keep a slow stretch slow, enough blocks to draw."""
    return int(np.clip(round(np.sqrt(max(n_requests, 1))), 1, MAX_BLOCKS))


def paired(a: Sequence[Launch], b: Sequence[Launch]) -> bool:
    """Every launch on both sides sent the identical requests (same digest, same number of units)."""
    shapes = {(x.digest, len(x.units)) for x in (*a, *b)}
    return len(shapes) == 1 and next(iter(shapes))[0] is not None


def _launch_draws(launch: Launch, stat: Statistic, idx: np.ndarray) -> np.ndarray:
    """stat of `launch` under each row of inner resample indices idx (draws, n_units)."""
    out = np.empty(len(idx))
    chunk = max(1, 4_000_000 // max(launch.units.size, 1))  # bound the memory of large launches
    for s in range(0, len(idx), chunk):
        with np.errstate(divide="ignore", invalid="ignore"):
            out[s:s + chunk] = stat(launch.units[idx[s:s + chunk]], launch.scale)
    return out


def trial_value(launches: Sequence[Launch], stat: Statistic) -> float:
    """The trial's figure: the mean over its launches of stat on all of each launch's units."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.mean([stat(x.units[None], x.scale)[0] for x in launches]))


def hierarchical_draws(launches: Sequence[Launch], stat: Statistic, n_boot: int, rng: np.random.Generator,
                       inner: list[np.ndarray] | None = None, which_inner: np.ndarray | None = None) -> np.ndarray:
    """n_boot bootstrap values of the trial's figure: launches drawn with replacement, then units within each.

    inner: per launch, (n_boot, n_units) resample indices to use; which_inner: (n_boot, >= n launches), which of
    those resamples the k-th launch of each draw uses. Both shared with another trial pair the two by block.
    """
    n = len(launches)
    inner = inner or [rng.integers(0, len(x.units), size=(n_boot, len(x.units))) for x in launches]
    per_launch = np.stack([_launch_draws(x, stat, idx) for x, idx in zip(launches, inner)])  # (n, n_boot)
    if n == 1 and which_inner is None:
        return per_launch[0]
    pick = rng.integers(0, n, size=(n_boot, n))  # which launches a draw holds
    if which_inner is None:  # an independent inner resample for each pick
        which_inner = rng.integers(0, n_boot, size=(n_boot, n))
    return per_launch[pick, which_inner[:, :n]].mean(axis=1)


def compare_trials(a: Sequence[Launch], b: Sequence[Launch], stat: Statistic, relative: bool = False,
                   n_boot: int = 2000, seed: int = 0, level: float = LEVEL) -> Interval:
    """Interval of figure(a) - figure(b) (or figure(a)/figure(b) - 1 in percent), paired by block when possible."""
    if not a or not b:
        return Interval(float("nan"), float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    combine = (lambda x, y: (x / y - 1) * 100) if relative else (lambda x, y: x - y)
    with np.errstate(divide="ignore", invalid="ignore"):
        point = float(combine(np.float64(trial_value(a, stat)), np.float64(trial_value(b, stat))))
    if paired(a, b):
        # Each draw's k-th launch on either side resamples the same request blocks, so the noise the request mix
        # contributes cancels in the difference. Launches themselves are still drawn independently: A's and B's
        # launches are separate server starts with nothing known in common, and their newest-first lists hold
        # only the ok, reliable launches (a failed, unreliable or extra `auto` launch shifts the rest), so the
        # i-th of each is not reliably one interleaved round; pairing them would claim a correlation not measured.
        n_units = len(a[0].units)
        shared = rng.integers(0, n_units, size=(n_boot, n_units))
        n = max(len(a), len(b))  # one launch a side: draw k is resample k on both sides already
        which = rng.integers(0, n_boot, size=(n_boot, n)) if n > 1 else None
        da = hierarchical_draws(a, stat, n_boot, rng, [shared] * len(a), which)
        db = hierarchical_draws(b, stat, n_boot, rng, [shared] * len(b), which)
    else:
        da = hierarchical_draws(a, stat, n_boot, rng)
        db = hierarchical_draws(b, stat, n_boot, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = combine(da, db)
    v = v[np.isfinite(v)]
    if not len(v) or not np.isfinite(point):
        return Interval(point, float("nan"), float("nan"))
    lo = (1 - level) / 2
    # two-sided bootstrap p-value of "no difference": twice the smaller tail beyond zero
    p = float(min(1.0, 2 * min((v <= 0).mean(), (v >= 0).mean()) + 1 / (len(v) + 1)))
    return Interval(point, float(np.quantile(v, lo)), float(np.quantile(v, 1 - lo)), p)


def trial_interval(launches: Sequence[Launch], stat: Statistic, n_boot: int = 2000, seed: int = 0,
                   level: float = LEVEL) -> Interval:
    """The trial's figure with its hierarchical 95% interval."""
    if not launches:
        return Interval(float("nan"), float("nan"), float("nan"))
    v = hierarchical_draws(launches, stat, n_boot, np.random.default_rng(seed))
    v = v[np.isfinite(v)]
    lo = (1 - level) / 2
    point = trial_value(launches, stat)
    if not len(v):
        return Interval(point, float("nan"), float("nan"))
    return Interval(point, float(np.quantile(v, lo)), float(np.quantile(v, 1 - lo)))


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


def verdict(iv: Interval, higher_is_better: bool, confident: bool, launches: tuple[int, int]) -> str:
    """better / worse / can't tell; with one launch on either side, says the launch-to-launch spread is unknown."""
    if not confident or not np.isfinite(iv.estimate):
        word = "can't tell"
    else:
        word = "better" if (iv.estimate > 0) == higher_is_better else "worse"
    if min(launches) < 2:
        word += " (one launch: launch-to-launch spread unknown)"
    return word
