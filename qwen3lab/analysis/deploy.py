"""What a measured run becomes when it is deployed: the real checkpoint, the winner's flags, none of the measuring kit.

A run measured with dummy weights (`load_format: dummy`: random values in the real architecture) measured the real
model's speed and memory, not its text. Its engine.model is a built-in architecture (`builtin:qwen3-14b-fp8`) or
the local folder qwen3lab made for it (`~/.cache/qwen3lab/dummy-models/qwen3-14b-fp8-v1`); deploying either would
serve random weights. So the export names the hub checkpoint of that architecture and quantization, drops what
only the measuring host needed (dummy weights, offline switches, its python, the CPU test engine's knobs), and
says so. The tiny built-in test model has no checkpoint anywhere: the user names one (`--model`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3lab.errors import Qwen3LabError
from qwen3lab.experiment.spec import EngineConfig
from qwen3lab.models import BUILTIN_PREFIX, BUILTINS, HUB_TO_BUILTIN, find_config, model_info

# Environment of the measuring host only, each with why it is left out of a deployment.
KIT_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "kept the measuring host off the hub: its model folder was local",
    "TRANSFORMERS_OFFLINE": "kept the measuring host off the hub",
    "HF_DATASETS_OFFLINE": "kept the measuring host off the hub",
    "VLLM_USE_FLASHINFER_SAMPLER": "a workaround for the measuring build, which had no FlashInfer",
    "VLLM_CPU_KVCACHE_SPACE": "the CPU test engine's KV cache size; a GPU server sizes its own",
    "VLLM_CPU_OMP_THREADS_BIND": "the CPU test engine's thread pinning",
}
# The folder models.dummy_model_dir makes for a builtin: NAME-vLAYOUT under .../dummy-models/
_DUMMY_FOLDER = re.compile(r"(?P<name>.+)-v\d+")
# What makes two config.json the same checkpoint family, for a local dummy folder of unknown name
_SHAPE = ("architecture", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
          "quant_method", "quant_bits")


class DeployError(Qwen3LabError):
    pass


def _builtin_of(model: str, load_format: str | None) -> str | None:
    """The builtin NAME a model stands for: builtin:NAME, a dummy-models/NAME-vN folder, or a local dummy folder
    whose config.json has a builtin's shape."""
    if model.startswith(BUILTIN_PREFIX):
        return model[len(BUILTIN_PREFIX):]
    path = Path(model).expanduser()
    m = _DUMMY_FOLDER.fullmatch(path.name)
    if path.parent.name == "dummy-models" and m and m["name"] in BUILTINS:
        return m["name"]
    if load_format == "dummy" and path.is_dir() and find_config(model):
        mine = model_info(model)
        for name in BUILTINS:
            theirs = model_info(BUILTIN_PREFIX + name)
            if all(getattr(mine, f) == getattr(theirs, f) for f in _SHAPE):
                return name
    return None


def checkpoint(config: EngineConfig, model: str | None = None) -> str:
    """The checkpoint to deploy: `model` when given, else the hub id of the measured architecture."""
    if model:
        return model
    name = _builtin_of(config.model, config.load_format)
    if name is not None:
        hub = BUILTINS.get(name, (None, None))[0]
        if hub is None:
            raise DeployError(
                f"engine.model {config.model!r} is {BUILTIN_PREFIX}{name}, a test model of qwen3lab with no "
                f"checkpoint on the Hugging Face hub: there is nothing real to deploy. Allowed: a hub id or a folder "
                f"of real weights. Fix: give the checkpoint to deploy, e.g. `--model Qwen/Qwen3-0.6B` (the Export "
                f"page's Model box); the winner's flags are kept")
        return hub
    local = Path(config.model).expanduser()
    if config.load_format == "dummy" and (local.is_absolute() or local.exists() or config.model.startswith(".")):
        raise DeployError(
            f"engine.model {config.model!r} is a local folder measured with dummy weights, whose architecture is not "
            f"one qwen3lab ships ({', '.join(h for h in HUB_TO_BUILTIN)}): which checkpoint it stands for is not "
            f"recorded. Fix: give it, e.g. `--model Qwen/Qwen3-14B`")
    return config.model  # a hub id, or a folder of real weights


def _clean(data: dict[str, Any], left_out: dict[str, str]) -> dict[str, Any]:
    """A config's dict (base or a route's overrides) without the measuring kit; what went, into left_out."""
    out = dict(data)
    if out.get("load_format") == "dummy":
        out.pop("load_format")
        left_out["--load-format dummy"] = "random weights: the deployment loads the real ones"
    if out.get("python"):
        left_out[f"engine.python {out.pop('python')}"] = "the measuring host's vLLM build; yours is `vllm`"
    if out.get("build"):
        left_out[f"engine.build {out.pop('build')}"] = "a vLLM build named on the measuring host; yours is `vllm`"
    env = dict(out.get("env") or {})
    for k in list(env):
        if k in KIT_ENV:
            left_out[f"{k}={env.pop(k)}"] = KIT_ENV[k]
    if "env" in out:
        out["env"] = env
    return out


@dataclass(frozen=True)
class Deployment:
    config: EngineConfig  # the checkpoint and the winner's flags, nothing of the measuring kit
    measured: str  # what the measurement stands for, in one sentence
    from_winner: list[str]  # the flags the winning config set (vLLM's defaults for everything else)
    left_out: dict[str, str]  # what the measuring host had and the deployment has not -> why
    trial: str  # "the winner fp8-online" reads wrong for a run that did not win: the trial's name

    def header(self) -> list[str]:
        flags = " ".join(self.from_winner) or "none (vLLM's defaults won)"
        lines = [self.measured, f"flags from {self.trial}: {flags}"]
        if self.left_out:
            lines.append("left out (the measuring kit only): " + "; ".join(f"{k} ({why})" for k, why in self.left_out.items()))
        return lines


def deployment(config: EngineConfig, run: dict[str, Any] | None = None, model: str | None = None) -> Deployment:
    """The measured config as it deploys: `model` or the architecture's hub checkpoint, kit switches left out."""
    run = run or {}
    ckpt = checkpoint(config, model)
    left_out: dict[str, str] = {}
    data = _clean(config.model_dump(mode="json"), left_out)
    data["model"] = ckpt
    if data.get("tokenizer") and "dummy-models" in str(data["tokenizer"]):
        left_out[f"--tokenizer {data.pop('tokenizer')}"] = "the measuring host's stand-in tokenizer"
    if config.topology is not None:
        routes = {n: _clean(r, left_out) for n, r in config.topology.routes.items()}
        data["topology"] = {**config.topology.model_dump(mode="json"), "routes": routes}
    deployed = EngineConfig.model_validate(data)
    on = f" on {run['gpu']}" if run.get("gpu") else ""
    measured_as = _hub_of(config)  # the checkpoint the measurement stands for (None: a test or unknown model)
    if config.load_format == "dummy" and measured_as == ckpt:
        measured = (f"measured with dummy weights (random values, the real architecture){on}: speed and memory are "
                    f"{ckpt}'s, the text it wrote was not: check answer quality on the real checkpoint")
    elif config.load_format == "dummy":
        measured = (f"measured with dummy weights of {config.model}{on}; deploys {ckpt} as asked: its speed and "
                    "memory were not measured")
    elif ckpt != config.model:
        measured = f"measured with the weights of {config.model}{on}; deploys {ckpt} as asked: its speed was not measured"
    else:
        measured = f"measured with the weights of {ckpt}{on}"
    if deployed.topology is None:
        flags = deployed.serve_flags()
    else:
        flags = [f"{n}: {' '.join(c.serve_flags())};" for n, c in deployed.route_engines().items()]
    trial = f"trial {run['trial']}" if run.get("trial") else "the measured config"
    return Deployment(deployed, measured, flags, left_out, trial)


def _hub_of(config: EngineConfig) -> str | None:
    try:
        return checkpoint(config)
    except DeployError:
        return None
