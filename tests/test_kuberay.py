"""`qwen3lab k8s`: KubeRay manifests validated against the real schemas (no cluster here).

Kubernetes' own objects (ConfigMap, PVC, the pod templates as PodTemplates) go through kubernetes-validate's
strict schemas; RayCluster and RayJob through the openAPIV3Schema of KubeRay v1.7.0's CRDs (tests/data/kuberay,
see its README), made strict the way the API server's strict field validation is: an unknown field is an error.
"""
from __future__ import annotations

import copy
import gzip
import json
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml

from qwen3lab import kuberay
from qwen3lab.errors import SpecErrors

from .conftest import REPO

CRDS = REPO / "tests" / "data" / "kuberay"
K8S_VERSION = "1.33.0"


def strict(schema):
    """Unknown fields refused wherever the CRD lists the fields and does not keep unknown ones."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def crd_schema(kind: str):
    with gzip.open(CRDS / f"ray.io_{kind}.v1.schema.json.gz") as f:
        return strict(json.load(f))


def crd_errors(doc) -> list[str]:
    schema = crd_schema({"RayCluster": "rayclusters", "RayJob": "rayjobs"}[doc["kind"]])
    return [f"{'/'.join(map(str, e.path))}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]


def pod_templates(cluster):
    spec = cluster["spec"]
    return [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]


def check(docs):
    config, claim, cluster, job = docs
    for doc in (config, claim):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    for template in pod_templates(cluster):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                      "template": template}, K8S_VERSION, strict=True)
    for doc in (cluster, job):
        assert crd_errors(doc) == [], crd_errors(doc)


@pytest.mark.parametrize("experiment, nodes, gpus", [("a100-80g-qwen3-14b.yaml", 2, 8), ("cpu-tiny.yaml", 2, None)])
def test_manifests_pass_the_kubernetes_and_kuberay_schemas(tmp_path, experiment, nodes, gpus):
    path = REPO / "experiments" / experiment
    out = tmp_path / "job.yaml"
    args = ["k8s", str(path), "--image", "ghcr.io/example/qwen3lab:0.1", "--nodes", str(nodes), "--out", str(out)]
    got = subprocess.run([sys.executable, "-m", "qwen3lab.cli", *args, *(["--gpus-per-node", str(gpus)] if gpus else [])],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert got.returncode == 0, got.stderr
    docs = list(yaml.safe_load_all(out.read_text()))
    assert [d["kind"] for d in docs] == ["ConfigMap", "PersistentVolumeClaim", "RayCluster", "RayJob"]
    check(docs)
    config, claim, cluster, job = docs
    assert config["data"]["experiment.yaml"] == path.read_text()  # the experiment travels whole
    workers = cluster["spec"]["workerGroupSpecs"][0]
    assert workers["replicas"] == nodes
    limits = workers["template"]["spec"]["containers"][0]["resources"]["limits"]
    if gpus:
        assert workers["rayStartParams"]["num-gpus"] == str(gpus) and limits["nvidia.com/gpu"] == str(gpus)
    else:
        assert json.loads(json.loads(workers["rayStartParams"]["resources"])) == {"vllm_slot": 1}
        assert "nvidia.com/gpu" not in limits
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    # The entrypoint names the mounted experiment and the volume's DuckDB, and is a command the CLI takes.
    argv = job["spec"]["entrypoint"].split()
    assert argv[:2] == ["qwen3lab", "run"] and argv[argv.index("--executor") + 1] == "ray"
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in head["containers"][0]["volumeMounts"]}
    assert argv[2] == f"{mounts['experiment']}/experiment.yaml"
    assert argv[argv.index("--db") + 1].startswith(mounts["results"] + "/")
    assert {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in head["volumes"]}["results"] \
        == claim["metadata"]["name"]


def test_the_schemas_catch_a_wrong_field():
    """The validation can fail: a misspelt field and a wrong type are both refused."""
    docs = kuberay.manifests(REPO / "experiments" / "cpu-tiny.yaml", kuberay.Shape(image="img"))
    cluster = copy.deepcopy(docs[2])
    cluster["spec"]["workerGroupSpecs"][0]["replica"] = 2
    assert any("replica" in e for e in crd_errors(cluster))
    job = copy.deepcopy(docs[3])
    job["spec"]["backoffLimit"] = "two"
    assert any("backoffLimit" in e for e in crd_errors(job))
    claim = copy.deepcopy(docs[1])
    claim["spec"]["accessMode"] = ["ReadWriteOnce"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(claim, K8S_VERSION, strict=True)


def test_a_cluster_too_small_for_a_trial_is_refused(tmp_path):
    path = tmp_path / "tp4.yaml"
    path.write_text("name: tp4\ngpu: h200\nengine: {model: builtin:qwen3-14b}\nworkload: {num_requests: 4}\n"
                    "chapters:\n  main:\n    trials: [{name: tp4, engine.tensor_parallel_size: 4}]\n")
    with pytest.raises(SpecErrors) as caught:
        kuberay.manifests(path, kuberay.Shape(image="img", gpus_per_node=2))
    (err,) = caught.value.errors
    assert err.field == "--gpus-per-node" and err.value == 2 and "main/tp4" in err.where
    docs = kuberay.manifests(path, kuberay.Shape(image="img"))  # by default, the most one trial needs
    assert docs[2]["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] == "4"
