"""compare's intervals on real runs (tests/data/dashboard): point estimates are the exact figures, and a rate's
interval has width even when every request has the same output length (resampling single requests against a
fixed duration gave a zero-width interval: 'beyond noise' for any difference)."""
from __future__ import annotations

import pytest

from qwen3lab.analysis import compare, stats
from qwen3lab.experiment.spec import SLO
from tests import dashdata


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    store = dashdata.build(tmp_path_factory.mktemp("noise") / "noise.duckdb", with_extras=False)
    return compare.load_runs(store, list(store.runs(status="ok").run_id))


@pytest.mark.parametrize("metric", ["goodput", "output_throughput", "p95_ttft_ms"])
def test_intervals_hold_the_exact_difference_and_have_width(runs, metric):
    slo = SLO(ttft_p95_ms=3000, tpot_p95_ms=100)
    a, b = runs[0], runs[1]
    iv = compare.difference(a, b, slo, metric)
    ranked = compare.rank([a, b], slo).set_index("run_id")
    key = {"goodput": "goodput", "output_throughput": "output_throughput", "p95_ttft_ms": "p95_ttft_ms"}[metric]
    exact = ranked.loc[a.run_id, key] - ranked.loc[b.run_id, key]
    assert iv.estimate == pytest.approx(exact, rel=1e-9, abs=1e-9)
    assert iv.low < iv.estimate < iv.high or (metric == "p95_ttft_ms" and iv.low <= iv.estimate <= iv.high)
    assert iv.high - iv.low > 0


def test_fixed_lengths_still_give_a_throughput_interval(runs):
    a = runs[0]
    assert len(set(a.table.output_tokens)) == 1  # fixed-128: every request the same length
    iv = compare.difference(a, a, SLO(), "output_throughput", relative=True)
    assert iv.estimate == pytest.approx(0.0) and iv.low < -1 and iv.high > 1  # a run against itself: noise, in %
    # one launch a side: the within-launch noise alone, and no verdict beyond "one launch"
    assert iv.one_launch and stats.verdict(iv, True, iv.excludes_zero) == stats.ONE_LAUNCH
