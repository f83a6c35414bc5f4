"""Shared fixtures: one real vLLM server (the embedded default engine) per test session, and temp stores."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from qwen3lab.experiment.spec import EngineConfig, Workload

REPO = Path(__file__).resolve().parents[1]

# The tiny model on vLLM's CPU backend, eager so it starts fast; 1 GiB of KV cache is ample for it.
TINY = dict(model="builtin:qwen3-tiny", load_format="dummy", max_model_len=2048, enforce_eager=True,
            env={"VLLM_CPU_KVCACHE_SPACE": "1"})


def tiny_config(**overrides) -> EngineConfig:
    return EngineConfig(**{**TINY, **overrides})


def small_workload(**overrides) -> Workload:
    base = dict(num_requests=24, mix="fixed-128", concurrency=8, seed=0)
    return Workload(**{**base, **overrides})


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory):
    """A real `vllm serve` of the tiny Qwen3 on the CPU, shared by the tests that only need a server."""
    from qwen3lab.measure import engine

    log = tmp_path_factory.mktemp("server") / "server.log"
    before = {p.pid for p in vllm_processes()}
    with engine.launch(tiny_config(), log, ready_timeout_s=600) as server:
        SHARED_SERVER_PIDS.update(p.pid for p in vllm_processes() if p.pid not in before)
        try:
            yield server
        finally:
            SHARED_SERVER_PIDS.clear()


@pytest.fixture
def store(tmp_path):
    from qwen3lab.store import Store

    return Store(tmp_path / "test.duckdb")


def spooled_requests(runs_dir) -> int:
    """Requests the runs under runs_dir have finished so far: the spool has them at once, DuckDB after the load."""
    from qwen3lab.spool import Spool

    return sum(len(Spool(p).read().requests) for p in Path(runs_dir).glob("*/spool.jsonl"))


SHARED_SERVER_PIDS: set[int] = set()  # the session's tiny_server: it outlives every test, by design


def vllm_processes() -> list:
    """vLLM server processes started by this test process (children, at any depth), but the shared tiny_server."""
    import psutil

    me = psutil.Process(os.getpid())
    out = []
    for p in me.children(recursive=True):
        try:
            if "vllm" in " ".join(p.cmdline()) and p.pid not in SHARED_SERVER_PIDS:
                out.append(p)
        except psutil.Error:
            pass
    return out


# --- `make test`: two workers ---------------------------------------------------------------------------------
# `make test` runs the suite in two pytest-xdist workers, a test file each at a time (--dist loadfile keeps a
# file's module fixtures, and its servers, in one worker). A vLLM CPU server's start is three processes importing
# torch one after the other, one core busy at a time: with the servers of one process on core 1 (cpu_server_pin)
# and everything else waiting, one stream left the other core idle for half the suite. So each worker holds one
# core of its own: its client, its servers (unpinned on one core) and its notebooks' kernels.
# The files that take longest go first, so that neither worker is left with a long one at the end.
SLOWEST_FIRST = ["test_notebooks.py", "test_capacity.py", "test_ray_executor.py", "test_sweep.py", "test_faults.py",
                 "test_soak.py", "test_search.py", "test_router.py", "test_topology.py", "test_fidelity.py",
                 "test_engine.py", "test_cli.py", "test_traffic_server.py", "test_builds.py", "test_schedule.py",
                 "test_loadgen.py", "test_dashboard_browser.py", "test_claims_why.py", "test_campaigns.py"]


def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
    if worker:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(worker.removeprefix("gw")) % len(cpus)]})


# --- `make test-fast`: the tests that start no vLLM server -------------------------------------------------
# A test is marked `server` by a fixture it takes (directly or through another fixture) or by its name below;
# `make test-fast` runs `-m "not server"`. There a watcher fails any unmarked test that starts vLLM, so this
# list cannot silently go stale: add the test's name here, or take one of the fixtures.
SERVER_FIXTURES = {"tiny_server", "searched", "soaked", "cluster", "backend", "executed"}
SERVER_TESTS = {
    "test_builds.py::test_a_trial_on_a_named_build_runs_on_it_and_its_run_names_it",
    "test_builds.py::test_builds_add_again_checks_the_cached_release",  # imports vLLM (its check), no server
    "test_builds.py::test_remove_forgets_a_named_python_and_leaves_it",  # imports vLLM (its check), no server
    "test_cli.py::test_run_end_to_end_then_resume",
    "test_engine.py::test_unknown_flag_fails_with_the_reason_from_the_log",
    "test_engine.py::test_kv_cache_too_small_is_out_of_memory",
    "test_engine.py::test_health_timeout_tears_down",
    "test_engine.py::test_server_killed_mid_run_is_stored_as_crashed",
    "test_engine.py::test_stop_leaves_no_process_or_port",
    "test_engine.py::test_launcher_killed_with_its_children_leaves_no_engine_core",
    "test_export.py::test_pasted_launch_command_starts_the_same_server",
    "test_faults.py::test_qwen3lab_sigkilled_then_resumed",
    "test_faults.py::test_port_taken_fails_with_the_reason_and_leaves_nothing",
    "test_fidelity.py::test_flusher_keeps_storage_and_progress_off_the_loop",
    "test_planner.py::test_a_real_cpu_run_stores_the_planner_capacity_beside_vllms",
    "test_search.py::test_two_objectives_run_nsga2_and_report_exactly_the_non_dominated_points",
    "test_search.py::test_sigterm_mid_search_then_resume_reruns_nothing_finished",
    "test_search.py::test_capacity_page_shows_a_search_history_best_so_far_importance_and_front",
    "test_secrets.py::test_secrets_are_redacted_everywhere_they_could_land",
    "test_secrets.py::test_a_secret_on_one_route_of_a_split_topology_is_redacted_in_its_row_and_every_log",
    "test_secrets.py::test_hostile_experiment_and_trial_names_are_only_data",
    "test_sweep.py::test_killed_sweep_resumes_without_duplicates_and_leaves_nothing_behind",
    "test_topology.py::test_split_trial_stores_each_requests_route",
    "test_topology.py::test_a_server_that_fails_to_start_takes_the_others_down",
}


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept
    for item in items:
        name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())) or name in SERVER_TESTS:
            item.add_marker(pytest.mark.server)


@pytest.fixture(autouse=True)
def _no_server_unless_marked(request):
    """Under -m "not server": fail a test that starts vLLM anyway, naming where to mark it."""
    if "not server" not in (request.config.getoption("markexpr") or "") or request.node.get_closest_marker("server"):
        yield
        return
    import threading

    seen: list[str] = []
    done = threading.Event()

    def is_server(p) -> bool:
        """A process named like vLLM that loaded torch: a server, not a script that prints vLLM's argv."""
        try:
            return "/torch/" in Path(f"/proc/{p.pid}/maps").read_text()
        except OSError:
            return False

    def watch():  # a vLLM server takes seconds to start: a look every 0.5 s cannot miss one
        while not done.wait(0.5) and not seen:
            seen.extend(" ".join(p.cmdline())[:200] for p in vllm_processes() if is_server(p))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    yield
    done.set()
    thread.join()
    if seen:
        pytest.fail(f"{request.node.nodeid} started vLLM ({seen[0]}) but is not marked `server`: add it to "
                    "SERVER_TESTS in tests/conftest.py, or take a server fixture", pytrace=False)
