"""Exported launch commands: shell quoting round-trips (also through a real bash), the YAML parses and names the
same flags, the committed H200 runs export as deployments (the real checkpoint, no dummy weights or measuring-kit
switches, every format checked by bash -n, YAML and the Kubernetes schema), and the command a run stores, pasted
into bash, really starts the same vLLM server."""
from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwen3lab.measure import engine
from qwen3lab.analysis import deploy, export
from qwen3lab.measure.engine import Build
from qwen3lab.experiment.spec import EngineConfig
from qwen3lab.store import Store

NASTY = st.text(alphabet=st.sampled_from(list("ab Z09 '\"$;&|<>()`\\*?!#~{}[]=-_./:\t")), min_size=0, max_size=24)
ENV_NAME = st.from_regex(r"[A-Z][A-Z0-9_]{0,12}", fullmatch=True)


def configs():
    return st.builds(
        lambda env, extra, name, seqs, eager, numa, hf: EngineConfig(
            model="builtin:qwen3-tiny", load_format="dummy", env=env, extra_args=extra, served_model_name=name,
            max_num_seqs=seqs, enforce_eager=eager, numa_node=numa, hf_overrides=hf),
        st.dictionaries(ENV_NAME, NASTY, max_size=3),
        st.lists(st.tuples(st.sampled_from(["--api-key", "--chat-template", "--root-path"]), NASTY), max_size=2)
        .map(lambda pairs: [x for flag, v in pairs for x in (flag, v)]),
        st.none() | NASTY.filter(bool),
        st.none() | st.integers(1, 512),
        st.none() | st.booleans(),
        st.none() | st.integers(0, 3),
        st.none() | st.dictionaries(st.sampled_from(["a b", "c$d", "e;f"]), NASTY, max_size=2),
    )


BUILD = Build("/opt/my builds/v 0.32/bin/python", "0.32.0", "vllm-cpu", "2.13.0")
UPSTREAM = Build("/usr/bin/python3", "0.33.0", "vllm", "2.9.0")


@settings(max_examples=200, deadline=None)
@given(configs(), st.sampled_from([BUILD, UPSTREAM]), st.sampled_from(["127.0.0.1", "0.0.0.0"]), st.integers(1, 65535))
def test_shell_command_round_trips(config, build, host, port):
    launch = engine.shell_launch(config, build, host, port)
    text = engine.shell_command(launch)
    assert shlex.split(text) == launch.tokens()
    assert launch.argv == engine.exec_argv(config, port, build, host=host)  # the same argv engine.launch runs
    assert launch.env == {**engine.server_env_defaults(config), **config.env}


@pytest.fixture(scope="module")
def printer(tmp_path_factory) -> Path:
    """A stand-in for the build's python that prints the argv and environment bash gave it."""
    folder = tmp_path_factory.mktemp("print args")  # a space in the path, on purpose
    exe = folder / "python"
    exe.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                   "print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}))\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configs().filter(lambda c: c.numa_node is None))
def test_bash_runs_what_shell_split_gives(printer, config):
    """Pasted into bash, the command reaches the program with exactly the argv and env it was built from."""
    build = Build(str(printer), "0.32.0", "vllm-cpu", None)
    launch = engine.shell_launch(config, build, "127.0.0.1", 8123)
    out = subprocess.run(["bash", "-c", engine.shell_command(launch)], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"]})
    got = json.loads(out.stdout)
    assert got["argv"] == launch.argv[launch.argv.index(str(printer)) + 1:]  # after a taskset prefix, if any
    for k, v in launch.env.items():
        assert got["env"][k] == v


def _unescape(value: str) -> str:
    return value.replace("$$", "$")  # compose and Kubernetes read $$ as a literal $


@settings(max_examples=150, deadline=None)
@given(configs(), st.sampled_from([None, "0.32.0", "0.11.0rc1"]))
def test_container_forms_name_the_same_flags(config, version):
    c = export.container(config, version)
    docker = export.docker_run(c, config)
    tokens = shlex.split(docker)
    assert tokens[tokens.index(c.image) + 1:] == c.args
    assert c.image == (f"vllm/vllm-openai:v{version}" if version == "0.32.0" else "vllm/vllm-openai:latest")

    compose = yaml.safe_load(export._yaml([export.compose_dict(c)], ["header"]))
    service = compose["services"]["vllm"]
    assert [_unescape(a) for a in service["command"]] == c.args
    assert {k: _unescape(v) for k, v in service["environment"].items() if k != "HF_TOKEN"} == c.env

    deployment, svc = yaml.safe_load_all(export._yaml(export.kubernetes_dicts(c), ["header"]))
    box = deployment["spec"]["template"]["spec"]["containers"][0]
    assert [_unescape(a) for a in box["args"]] == c.args
    assert {e["name"]: _unescape(e["value"]) for e in box["env"] if "value" in e} == c.env
    assert box["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert svc["kind"] == "Service" and svc["spec"]["ports"][0]["port"] == 8000

    # The image's entrypoint is `vllm serve`: the args parse back into the same engine flags.
    args = c.args[:-4]  # without --host 0.0.0.0 --port 8000
    back = EngineConfig.from_argv(["vllm", "serve", *args], c.env)
    same = config.model_dump(exclude={"model", "python", "numa_node", "env", "tokenizer"})
    assert back.model_dump(exclude={"model", "python", "numa_node", "env", "tokenizer"}) == same


def test_builtin_models_in_containers():
    fp8 = export.container(EngineConfig(model="builtin:qwen3-14b-fp8", kv_cache_dtype="fp8"), "0.32.0")
    assert fp8.args[0] == "Qwen/Qwen3-14B-FP8" and not fp8.mounts  # the hub id: the image downloads the weights
    tiny = export.container(EngineConfig(model="builtin:qwen3-tiny"), None)
    assert tiny.args[0] == "/models/qwen3-tiny" and tiny.mounts[0][1] == "/models/qwen3-tiny"


def test_numa_node_in_shell_and_docker():
    config = EngineConfig(model="builtin:qwen3-tiny", numa_node=1, env={"VLLM_CPU_OMP_THREADS_BIND": "0-7"})
    launch = engine.shell_launch(config, BUILD)
    assert launch.argv[:3] == ["numactl", "--cpunodebind=1", "--membind=1"]
    assert shlex.split(engine.shell_command(launch))[:2] == ["HF_HUB_OFFLINE=1", "VLLM_CPU_OMP_THREADS_BIND=0-7"]
    c = export.container(config)
    assert "--cpuset-mems=1" in export.docker_run(c, config)
    assert any("NUMA node 1" in n for n in c.notes)


def test_runs_without_a_launch_command_say_why():
    with pytest.raises(export.ExportError, match="imported"):
        export.run_config({"run_id": "x", "engine_kind": "import", "config": None})


def _free_port() -> int:
    return engine.free_port()


@pytest.mark.timeout(900)
def test_pasted_launch_command_starts_the_same_server(tmp_path):
    """The real thing: a run stored as the runner stores it; its launch_command (this host's build, dummy weights),
    pasted into bash, starts vLLM and it answers /health. The export of that run deploys instead, so it asks
    which checkpoint the tiny test model stands for."""
    config = EngineConfig(model="builtin:qwen3-tiny", load_format="dummy", max_model_len=1024,
                          served_model_name="tiny; 'quoted' $name", env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    build = engine.probe_build(None)
    if build.distribution is None:
        pytest.skip("no vLLM build in this environment (pip install 'qwen3lab[cpu]')")
    store = Store(tmp_path / "paste.duckdb")
    run_id = store.begin_run(engine_kind="vllm", model=config.model, config_json=config.model_dump(mode="json"),
                             config_hash=config.config_hash(), launch_command=engine.launch_command(config),
                             exec_argv_json=engine.exec_argv(config, 8000, build), python_executable=build.python,
                             vllm_version=build.vllm_version, torch_version=build.torch_version, status="running")
    store.finish_run(run_id, "ok")
    with pytest.raises(deploy.DeployError, match="--model"):
        export.export_run(store.run(run_id))
    port = _free_port()
    command = engine.shell_command(engine.shell_launch(config, build, port=port))
    assert command == store.run(run_id)["launch_command"].replace("--port 8000", f"--port {port}")
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(["bash", "-c", command], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 720  # ~40 s alone on 2 cores; minutes when the machine is shared
        while True:
            assert proc.poll() is None, "the pasted command exited:\n" + (tmp_path / "server.log").read_text()[-3000:]
            try:
                status, _ = engine.http_get(f"http://127.0.0.1:{port}/health", timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "no /health within 720 s"
            time.sleep(1)
        status, body = engine.http_get(f"http://127.0.0.1:{port}/v1/models")
        served = json.loads(body)["data"][0]
        assert served["id"] == "tiny; 'quoted' $name" and served["max_model_len"] == 1024
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
