"""Kubernetes through KubeRay: the manifests that run an experiment's trials on a RayCluster.

Four documents: a ConfigMap holding the experiment file, a PersistentVolumeClaim for the one DuckDB (and the
server logs), a RayCluster (a head that runs the driver and no trials, and one worker group of GPU nodes, or
of CPU nodes offering one `vllm_slot` each), and a RayJob that runs `qwen3lab run ... --executor ray
--address auto` on that cluster. The cluster is checked against the experiment with the Ray executor's own
pre-flight before anything is written, so a manifest that could never run a trial is refused.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from qwen3lab.errors import SpecError, SpecErrors

CONFIG_DIR = "/config"
DATA_DIR = "/data"
RAY_PORTS = [{"name": "gcs", "containerPort": 6379}, {"name": "dashboard", "containerPort": 8265},
             {"name": "client", "containerPort": 10001}]


@dataclass(frozen=True)
class Shape:
    """What the manifests ask Kubernetes for."""

    image: str
    nodes: int = 1
    gpus_per_node: int | None = None  # None: the most GPUs one trial needs (at least 1); CPU experiments: 0
    storage: str = "50Gi"
    namespace: str | None = None
    cpus_per_server: int = 8  # a worker pod gets this (and memory_gib_per_server) per GPU, or per CPU slot
    memory_gib_per_server: int = 64


def _name(experiment: str) -> str:
    """A DNS-1123 name for the experiment (Kubernetes object names: lower case, digits and '-')."""
    name = re.sub(r"[^a-z0-9-]+", "-", experiment.lower()).strip("-")[:40].strip("-")
    return f"qwen3lab-{name or 'experiment'}"


def manifests(path: str | Path, shape: Shape) -> list[dict]:
    """The ConfigMap, PVC, RayCluster and RayJob for an experiment file (errors before anything is written)."""
    import ray

    from qwen3lab.measure import executor, ray_executor

    path = Path(path)
    planned = executor.plan(path, for_written_gpu=True)  # judged for the GPU the pods will have
    exp, trials, errors = planned.experiment, planned.trials, list(planned.errors)
    if shape.nodes < 1:
        errors.append(SpecError("--nodes", shape.nodes, "1 or more", "ask for at least one worker node"))
    gpu = bool(exp.gpu and exp.gpu != "cpu")
    per_node = shape.gpus_per_node
    if per_node is None:
        per_node = max([ray_executor.gpus_needed(t) for t in trials] + [1]) if gpu else 0
    if gpu and per_node < 1:
        errors.append(SpecError("--gpus-per-node", per_node, "1 or more for a GPU experiment",
                                f"the experiment runs on {exp.gpu}: give each node its GPUs"))
    elif gpu:
        # The Ray executor's own check, on the nodes this manifest asks for.
        node = {"Alive": True, "Resources": {"GPU": per_node,
                                             f"accelerator_type:{ray_executor.accelerator_type(exp.gpu)}": 1}}
        errors += [SpecError("--gpus-per-node" if e.field == "engine.tensor_parallel_size" else e.field, per_node
                             if e.field == "engine.tensor_parallel_size" else e.value, e.allowed, e.fix, e.where)
                   for e in ray_executor.cluster_errors(trials, exp.gpu, [node])]
    if errors:
        raise SpecErrors(errors)

    name = _name(exp.name)
    meta = {"labels": {"app.kubernetes.io/name": "qwen3lab", "qwen3lab/experiment": name}}
    if shape.namespace:
        meta["namespace"] = shape.namespace
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-experiment", **meta},
              "data": {"experiment.yaml": path.read_text()}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": f"{name}-results", **meta},
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": shape.storage}}}}
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name, **meta},
               "spec": {"rayVersion": ray.__version__, "headGroupSpec": _head(shape, name),
                        "workerGroupSpecs": [_workers(shape, per_node, gpu)]}}
    entrypoint = (f"qwen3lab run {CONFIG_DIR}/experiment.yaml --executor ray --address auto "
                  f"--db {DATA_DIR}/qwen3lab.duckdb --runs-dir {DATA_DIR}/runs")
    job = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": f"{name}-run", **meta},
           "spec": {"clusterSelector": {"ray.io/cluster": name}, "entrypoint": entrypoint,
                    # resume is what a retry does: finished trials are read back from the DuckDB on the volume
                    "backoffLimit": 2}}
    return [config, claim, cluster, job]


def _container(shape: Shape, name: str, mounts: list[dict], resources: dict) -> dict:
    return {"name": name, "image": shape.image, **({"ports": RAY_PORTS} if name == "ray-head" else {}),
            "resources": resources, "volumeMounts": mounts,
            "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token",
                                                                        "optional": True}}}]}


def _head(shape: Shape, name: str) -> dict:
    mounts = [{"name": "experiment", "mountPath": CONFIG_DIR, "readOnly": True},
              {"name": "results", "mountPath": DATA_DIR}]
    volumes = [{"name": "experiment", "configMap": {"name": f"{name}-experiment"}},
               {"name": "results", "persistentVolumeClaim": {"claimName": f"{name}-results"}}]
    limits = {"cpu": "4", "memory": "16Gi"}
    return {
        # The head holds the driver and the one DuckDB; it offers no GPU and no slot, so no trial lands there.
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
        "template": {"spec": {"containers": [_container(shape, "ray-head", mounts, {"limits": limits,
                                                                                     "requests": limits})],
                              "volumes": volumes}},
    }


def _workers(shape: Shape, per_node: int, gpu: bool) -> dict:
    from qwen3lab.measure.ray_executor import SLOT

    servers = max(per_node, 1)
    limits = {"cpu": str(shape.cpus_per_server * servers), "memory": f"{shape.memory_gib_per_server * servers}Gi"}
    params = {"num-gpus": str(per_node)} if gpu else {"resources": json.dumps(json.dumps({SLOT: 1}))}
    if gpu:
        limits["nvidia.com/gpu"] = str(per_node)
    mounts = [{"name": "shm", "mountPath": "/dev/shm"}]  # vLLM's workers share tensors through /dev/shm
    volumes = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    return {"groupName": "gpu" if gpu else "cpu", "replicas": shape.nodes, "minReplicas": shape.nodes,
            "maxReplicas": shape.nodes, "rayStartParams": params,
            "template": {"spec": {"containers": [_container(shape, "ray-worker", mounts, {"limits": limits,
                                                                                           "requests": limits})],
                                  "volumes": volumes}}}


def yaml_text(docs: list[dict]) -> str:
    """Manifests as YAML documents, a multi-line string (an experiment file) kept as a block, as it was written."""
    import yaml

    class Readable(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    def text(dumper, value):
        block = "\n" in value and not any(line != line.rstrip() for line in value.splitlines())
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if block else None)

    Readable.add_representer(str, text)
    return "---\n".join(yaml.dump(d, Dumper=Readable, sort_keys=False, width=10**6) for d in docs)


def manifest_text(path: str | Path, shape: Shape) -> str:
    docs = manifests(path, shape)
    header = [f"qwen3lab k8s {path} --image {shape.image}: KubeRay RayCluster + RayJob running the experiment.",
              "kubectl apply -f THIS.yaml   (needs the KubeRay operator: helm install kuberay-operator kuberay/kuberay-operator)",
              f"Results: the DuckDB at {DATA_DIR}/qwen3lab.duckdb on PVC {docs[1]['metadata']['name']}."]
    return "".join(f"# {line}\n" for line in header) + yaml_text(docs)
