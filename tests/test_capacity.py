"""Capacity: the load-axis search (pure), then real capacity searches on real vLLM servers, one per configuration."""
from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
import yaml

from qwen3lab.experiment import files as xp
from qwen3lab.experiment.spec import Capacity, Workload
from qwen3lab.measure import capacity as cap

from .conftest import REPO, TINY, vllm_processes


def _search(spec: Capacity, truth: float, start: float = 1.0) -> list[tuple[float, bool]]:
    """Run next_load against a configuration whose true capacity is `truth`."""
    points: list[tuple[float, bool]] = []
    while (load := cap.next_load(points, spec, start)) is not None:
        points.append((load, load <= truth))
    return points


@pytest.mark.parametrize("truth", [0.3, 1.0, 3.7, 7.3, 50.0])
def test_rate_search_doubles_then_bisects_to_the_tolerance(truth):
    spec = Capacity(axis="request_rate", tolerance=0.05, max_points=16)
    points = _search(spec, truth)
    loads = [load for load, _ in points]
    first_fail = next(i for i, (_, ok) in enumerate(points) if not ok)
    assert loads[:first_fail + 1] == [2.0 ** i for i in range(first_fail + 1)] or loads[0] > truth
    low, high = cap.bracket(points)
    assert high is not None and high > truth
    assert low is None or (low <= truth and (high - low) / high <= spec.tolerance)


def test_concurrency_search_stays_on_whole_numbers_and_stops_at_adjacent_ones():
    spec = Capacity(axis="concurrency", tolerance=0.01, max_points=16)
    points = _search(spec, truth=11)
    assert all(float(load).is_integer() for load, _ in points)
    assert cap.bracket(points) == (11, 12)


def test_max_points_bounds_the_search_and_no_failure_leaves_it_unbounded():
    spec = Capacity(axis="request_rate", max_points=4)
    points = _search(spec, truth=1e9)
    assert [load for load, _ in points] == [1.0, 2.0, 4.0, 8.0]
    assert cap.bracket(points) == (8.0, None)


def test_point_workload_opens_the_other_axis_and_gives_each_point_its_own_seed():
    base = Workload(num_requests=50, concurrency=16, seed=3, capacity=Capacity(axis="request_rate", requests_per_point=20))
    a = cap.point_workload(base, base.capacity, 4.0, 0, fresh_seed=True)
    b = cap.point_workload(base, base.capacity, 4.0, 1, fresh_seed=True)
    assert (a.request_rate, a.concurrency, a.num_requests, a.capacity) == (4.0, None, 20, None)
    assert a.seed != b.seed
    assert cap.point_workload(base, base.capacity, 4.0, 1, fresh_seed=False).seed == base.seed
    warm = base.model_copy(update={"warmup_requests": 6})  # the trial's warm-up goes before the first point only
    assert [cap.point_workload(warm, base.capacity, 4.0, i, True).warmup_requests for i in (0, 1)] == [8, 2]


def _record(i: int, ttft: float | None, error: str | None = None):
    from qwen3lab.measure.loadgen import RequestRecord

    return RequestRecord(i, "q", 64, 16, False, False, ttft=ttft, e2el=None if ttft is None else ttft + 0.3,
                         chunk_times=[] if ttft is None else [ttft] * 16, output_tokens=16, error=error)


def test_a_point_fails_early_once_too_many_requests_missed_and_on_an_open_loop_queue():
    from qwen3lab.experiment.spec import SLO

    spec = Capacity(axis="request_rate", min_attainment=0.9, saturation_waiting=10)
    judge = cap.PointJudge(spec, SLO(ttft_ms=100), planned=20)  # 2 misses of 20 allowed
    records = [_record(0, 0.05), _record(1, 0.5), _record(2, None, "HTTP 500"), _record(3, 0.05), _record(4, 0.2)]
    for i, rec in enumerate(records):
        judge.add(rec)
        assert judge.stop([]) == (i == 4)  # the third miss decides it: failures count as misses
    assert "3 of 20" in judge.early
    queue = cap.PointJudge(spec, SLO(ttft_ms=100), planned=20)
    assert not queue.stop([(0.0, "vllm", "vllm:num_requests_waiting", 9.0)])
    assert queue.stop([(1.0, "vllm", "vllm:num_requests_waiting", 12.0)]) and "saturated" in queue.early
    closed = cap.PointJudge(spec.model_copy(update={"axis": "concurrency"}), SLO(ttft_ms=100), planned=20)
    assert not closed.stop([(1.0, "vllm", "vllm:num_requests_waiting", 12.0)])  # bounded by the cap


def test_a_bad_capacity_field_is_refused_with_its_name(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "bad", "engine": TINY, "workload": {"capacity": {"axis": "qps"}},
                                    "trials": [{"name": "a"}]}))
    with pytest.raises(Exception) as got:
        xp.expand(xp.load(path))
    assert "workload.capacity.axis" in str(got.value) and "request_rate" in str(got.value)


# Prompts of 64 tokens, 128 generated. With max_num_seqs 4, a fifth request in flight waits for a whole
# 128-token generation before its first token (seconds on a CPU), while with vLLM's defaults every request
# is scheduled at once and only prefill sits before its first token (tens of ms): a 1 s TTFT target parts them.
# Tolerance 0.34 and 6 points: whichever of 2, 4, 8, 16, 32 fails first, the bisection reaches the tolerance
# within the points (a CI machine that passed 8 and failed 16 and 12 stopped at 8..12 with 5 points, 0.33 wide).
EXPERIMENT = {
    "name": "cap-test", "gpu": "cpu", "engine": TINY,
    "workload": {"mix": [{"name": "q", "prompt_tokens": 64, "output_tokens": 128}], "num_requests": 12,
                 "warmup_requests": 8,  # before the first point only: a fresh server's first requests are slow
                 "capacity": {"axis": "concurrency", "start": 2, "min_attainment": 0.9, "tolerance": 0.34,
                              "max_points": 6, "requests_per_point": 12, "warmup_per_point": 1}},
    "slo": {"ttft_ms": 1000},
    # max-num-seqs-4 on two launches: a search on each fresh server, combined (capacity.launches)
    "trials": [{"name": "max-num-seqs-4", "engine.max_num_seqs": 4, "workload.capacity.launches": 2},
               {"name": "vllm-defaults"}],
}


def _launch(capacity, low, high, status="ok"):
    return cap.CapacityResult(None, f"s{capacity}", "concurrency", status, capacity=capacity, low=low, high=high)


def test_launches_combine_to_their_median_and_an_interval_spanning_every_bracket():
    got = cap.combine([_launch(4, 4, 5), _launch(6, 6, 8), _launch(5, 5, 6)])
    assert (got.status, got.capacity, got.low, got.high) == ("ok", 5, 4, 8)
    assert [r.search_id for r in got.launches] == ["s4", "s6", "s5"] and got.reason.startswith("3 launches")
    # a launch that found no failing point leaves the interval open above
    got = cap.combine([_launch(4, 4, 5), _launch(16, 16, None, "unbounded")])
    assert (got.status, got.capacity, got.low, got.high) == ("unbounded", 10, 4, None)
    one = _launch(4, 4, 5)
    assert cap.combine([one]) is one
    # launches stored earlier (newest first) are enough: nothing is measured, and they combine in measured order
    trial = types.SimpleNamespace(workload=Workload(capacity=Capacity(launches=2)))
    got = cap.capacity_of(trial, store=None, done=[_launch(6, 6, 8), _launch(4, 4, 5), _launch(3, 3, 4)])
    assert [r.search_id for r in got.launches] == ["s4", "s6"] and got.capacity == 5


def test_capacities_are_compared_over_launches_with_the_verdicts_rules():
    """Capacity launches are launches: the top against each other configuration is Welch's t over launches with
    the bracket as each launch's own noise, Holm-corrected as the best of N; one launch gets no verdict."""
    from qwen3lab.analysis import stats
    from qwen3lab.workbook.capacity import against_top, capacity_figures

    top = cap.combine([_launch(16, 16, 17), _launch(17, 17, 18), _launch(16, 16, 17)])
    close = cap.combine([_launch(15, 15, 16), _launch(17, 17, 18), _launch(16, 16, 17)])
    far = cap.combine([_launch(4, 4, 5), _launch(5, 5, 6), _launch(4, 4, 5)])
    f = capacity_figures(top)
    assert list(f.values) == [16, 17, 16] and f.within_se == pytest.approx([1 / 12 ** 0.5] * 3)
    assert against_top([top, close, far]) == ["top", "can't tell", "worse"]
    assert against_top([top, _launch(4, 4, 5)]) == ["top", stats.ONE_LAUNCH]


def test_launches_are_not_part_of_a_trials_identity():
    # raising capacity.launches keeps the trial's key: the launches already measured count, only the rest run
    assert Workload(capacity=Capacity()).key_dump() == Workload(capacity=Capacity(launches=3)).key_dump()
    with pytest.raises(ValueError, match="launches"):
        Capacity(launches=0)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """Both configurations' capacities (max-num-seqs-4 on two launches), measured once in this process, with the
    server each point ran on."""
    from qwen3lab.store import Store

    tmp = tmp_path_factory.mktemp("capacity")
    path = tmp / "cap.yaml"
    path.write_text(yaml.safe_dump(EXPERIMENT, sort_keys=False))
    store = Store(tmp / "cap.duckdb")
    seen: dict[str, list] = {}
    results = {}
    for trial in xp.expand(xp.load(path)):
        box: dict = {}
        seen[trial.name] = []

        def on_point(point, box=box, name=trial.name):
            procs = vllm_processes()
            seen[name].append((box["server"].process.pid, box["server"].alive(), len({p.pid for p in procs})))

        results[trial.name] = cap.capacity_of(trial, store, tmp / "runs", str(path), gpu_id="cpu",
                                              on_point=on_point, on_server=lambda s, box=box: box.update(server=s))
    assert not vllm_processes(), "a server outlived its search"
    return path, store, results, seen


def test_one_real_server_serves_every_point_of_a_configuration(searched):
    _, store, results, seen = searched
    assert len(results["max-num-seqs-4"].launches) == 2 and not results["vllm-defaults"].launches
    for name, result in results.items():
        launches = result.launches or [result]
        pids = [pid for pid, _, _ in seen[name]]
        # one server per launch, alive for all of its points, a new one for the next launch
        assert len(set(pids)) == len(launches) and all(alive for _, alive, _ in seen[name]), seen[name]
        for launch in launches:
            assert launch.status in cap.SEARCH_DONE, (name, launch.status, launch.reason)
            assert len(launch.points) >= 2  # a slow machine may fail the first point: bisected once, one server
            assert len({pids.pop(0) for _ in launch.points}) == 1
            row = store.capacities(trial_key=result.trial.key).set_index("search_id").loc[launch.search_id]
            assert row.server_starts == 1 and row.points == len(launch.points)
            points = store.capacity_points([launch.search_id])
            assert list(points.point_index) == list(range(len(launch.points)))
            assert set(points.search_id) == {launch.search_id} and points.log_path.nunique() == 1
            log = open(points.log_path.iloc[0]).read()
            assert log.count("# qwen3lab exec:") == 1  # launched once for all of its points
            assert (points.status == "ok").all() and (points.completed > 0).all()


def test_bisection_on_a_real_server_lands_between_last_pass_and_first_fail(searched):
    _, store, results, _ = searched
    combined = results["max-num-seqs-4"]
    for result in combined.launches:
        assert result.status == "ok", result.reason
        passes = [p.load for p in result.points if p.passed]
        fails = [p.load for p in result.points if not p.passed]
        assert result.capacity == result.low == max(x for x in passes if x < min(fails))
        assert result.high == min(fails) and result.low < result.high
        spec = result.trial.workload.capacity
        assert (result.high - result.low) / result.high <= spec.tolerance or result.high - result.low == 1
        stored = store.capacity_points([result.search_id])
        assert list(stored.point_verdict) == ["pass" if p.passed else "fail" for p in result.points]
        assert all(0 <= a <= 1 for a in stored.attainment)
    # the configuration's capacity: the launches' median, its interval spanning both brackets
    first, second = combined.launches
    assert combined.capacity == (first.capacity + second.capacity) / 2
    assert (combined.low, combined.high) == (min(first.low, second.low), max(first.high, second.high))


def test_a_point_that_ended_early_says_so_and_sent_fewer_requests(searched):
    # A point ends early (PointJudge.early) only by not sending the rest of its requests: a point stored with
    # fewer requests than it planned says why in its summary and its verdict, and failed; every other point
    # sent all of its requests and says nothing of ending early.
    _, store, results, _ = searched
    for name, combined in results.items():
        for result in combined.launches or [combined]:
            starts = set()
            for p in result.points:
                row = store.run(p.run_id)
                starts.add(row["start_s"])
                early, planned = row["summary"].get("ended_early"), row["workload"]["num_requests"]
                sent = row["completed"] + row["failed"]
                assert (early is not None) == (sent < planned), (name, p.load, early, sent, planned)
                if early:
                    assert not p.passed and p.why == early and early.startswith(("failed early", "saturated")), p
            # every point stores the start of the one server it ran on (engine's process start to /health,
            # inside the search's own launch-to-ready time)
            assert len(starts) == 1 and 0 < starts.pop() <= result.start_s, (name, starts, result.start_s)


def test_max_num_seqs_4_has_a_lower_capacity_than_vllm_defaults(searched):
    _, _, results, _ = searched
    small, defaults = results["max-num-seqs-4"], results["vllm-defaults"]
    assert small.capacity is not None and defaults.capacity is not None
    assert small.capacity < defaults.capacity, (small.as_dict(), defaults.as_dict())


def test_cli_capacity_resumes_and_prints_json(searched):
    path, store, results, _ = searched
    got = subprocess.run([sys.executable, "-m", "qwen3lab.cli", "capacity", str(path), "--db", store.path, "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert got.returncode == 0, got.stderr
    rows = {r["trial"]: r for r in json.loads(got.stdout)}
    for name, result in results.items():
        assert rows[name]["search_id"] == result.search_id  # resumed: nothing was measured again
        assert rows[name]["capacity"] == result.capacity and rows[name]["axis"] == "concurrency"
        assert rows[name]["interval"] == [result.low, result.high]
        assert [p["load"] for p in rows[name]["points"]] == [p.load for p in result.points]
        assert [r["search_id"] for r in rows[name]["launches"]] == [r.search_id for r in result.launches or [result]]
    assert len(store.capacities()) == 3


def test_capacity_page_ranks_configurations_by_capacity(searched, monkeypatch):
    pytest.importorskip("streamlit")
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    _, store, results, _ = searched
    monkeypatch.setenv("QWEN3LAB_DB", store.path)
    st.cache_data.clear()
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=120)
    at.run()
    at.switch_page("views/capacity.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value
    want = sorted(results.values(), key=lambda r: -r.capacity)
    assert list(table.trial) == [r.trial.name for r in want]
    assert list(table.capacity) == [r.capacity for r in want]
    assert len(at.get("plotly_chart")) >= 1


def test_capacity_notebook_resumes_the_stored_searches_and_draws_load_curves(searched, tmp_path, monkeypatch):
    import nbformat
    import papermill as pm

    path, store, results, _ = searched
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    out = tmp_path / "95.out.ipynb"
    pm.execute_notebook(str(REPO / "notebooks" / "95_capacity.ipynb"), str(out), kernel_name="python3",
                        cwd=str(REPO), progress_bar=False,
                        parameters={"experiment": str(path), "db": store.path, "runs_dir": str(tmp_path / "runs"),
                                    "trials": list(results), "requests_per_point": None})
    nb = nbformat.read(out, as_version=4)
    text = "\n".join(str(o.get("data", o.get("text", ""))) for c in nb.cells for o in c.get("outputs", []))
    assert "application/vnd.plotly.v1+json" in text
    assert len(store.capacities()) == 3  # resumed: nothing measured again
    assert not (tmp_path / "runs").exists()
