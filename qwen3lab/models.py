"""Where a model's architecture comes from: built-in assets, a local folder, or the Hugging Face cache.

`builtin:NAME` names a folder shipped in qwen3lab/assets/models (no download ever). A hub id is read from the
local Hugging Face cache when present; nothing here goes to the network.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from qwen3lab.errors import SpecError

BUILTIN_PREFIX = "builtin:"
# Built-in name -> (hub id it stands for, tokenizer to use when the folder has none)
BUILTINS: dict[str, tuple[str | None, str | None]] = {
    "qwen3-tiny": (None, None),
    "qwen3-14b": ("Qwen/Qwen3-14B", "Qwen/Qwen3-14B"),
    "qwen3-14b-fp8": ("Qwen/Qwen3-14B-FP8", "Qwen/Qwen3-14B"),
    "qwen3-14b-awq": ("Qwen/Qwen3-14B-AWQ", "Qwen/Qwen3-14B"),
}
# Hub ids whose architecture we ship, so pre-flight and the planner work before any download.
HUB_TO_BUILTIN = {hub: name for name, (hub, _) in BUILTINS.items() if hub}


def assets_dir() -> Path:
    return Path(str(resources.files("qwen3lab") / "assets" / "models"))


def builtin_dir(name: str) -> Path:
    if name not in BUILTINS:
        raise SpecError(
            "engine.model", f"{BUILTIN_PREFIX}{name}", ", ".join(BUILTIN_PREFIX + n for n in BUILTINS),
            "use one of the built-in names, a local model folder, or a Hugging Face id",
        )
    return assets_dir() / name


def resolve_model_path(model: str) -> str:
    """What vLLM is given: built-in names become the shipped folder; anything else is passed as is."""
    if model.startswith(BUILTIN_PREFIX):
        return str(builtin_dir(model[len(BUILTIN_PREFIX):]))
    return model


def default_tokenizer(model: str) -> str | None:
    """A tokenizer for folders that ship only config.json (the 14B architecture folders)."""
    if model.startswith(BUILTIN_PREFIX):
        return BUILTINS.get(model[len(BUILTIN_PREFIX):], (None, None))[1]
    return None


def _hf_cache_config(hub_id: str) -> Path | None:
    home = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache/huggingface")) / "hub")
    snapshots = home / f"models--{hub_id.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return None
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def find_config(model: str) -> Path | None:
    """config.json for a model, or None when it is a hub id that is not cached (no network here)."""
    if model.startswith(BUILTIN_PREFIX):
        return builtin_dir(model[len(BUILTIN_PREFIX):]) / "config.json"
    local = Path(model).expanduser()
    if local.is_dir():
        cfg = local / "config.json"
        return cfg if cfg.is_file() else None
    if model in HUB_TO_BUILTIN:
        return builtin_dir(HUB_TO_BUILTIN[model]) / "config.json"
    return _hf_cache_config(model)


@dataclass(frozen=True)
class ModelInfo:
    """The architecture facts that rules and the planner need, read from config.json."""

    source: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    torch_dtype: str
    quant_method: str | None
    quant_bits: int | None
    quant_group_size: int | None
    raw: dict[str, Any]

    @classmethod
    def from_config(cls, cfg: dict[str, Any], source: str) -> "ModelInfo":
        cfg = {**cfg.get("text_config", {}), **cfg} if "text_config" in cfg else cfg
        heads = int(cfg["num_attention_heads"])
        q = cfg.get("quantization_config") or {}
        method = q.get("quant_method")
        bits = q.get("bits") or q.get("w_bit") or (8 if method == "fp8" else None)
        return cls(
            source=source,
            architecture=(cfg.get("architectures") or ["?"])[0],
            hidden_size=int(cfg["hidden_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
            quant_method=method,
            quant_bits=int(bits) if bits else None,
            quant_group_size=q.get("group_size") or q.get("q_group_size"),
            raw=cfg,
        )

    @property
    def has_qk_norm(self) -> bool:
        """Qwen3 normalizes each query and key head (q_norm, k_norm); Llama and Qwen2 do not."""
        return self.architecture.startswith("Qwen3")

    @property
    def num_parameters(self) -> int:
        h, layers, inter = self.hidden_size, self.num_layers, self.intermediate_size
        q = h * self.num_heads * self.head_dim
        kv = 2 * h * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * h
        norms = 2 * h + (2 * self.head_dim if self.has_qk_norm else 0)  # input/post norms, q_norm/k_norm
        per_layer = q + kv + o + 3 * h * inter + norms
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return layers * per_layer + embed + head + h


def model_info(model: str) -> ModelInfo | None:
    path = find_config(model)
    if path is None:
        return None
    return ModelInfo.from_config(json.loads(path.read_text()), source=str(path))
