"""Where a model's architecture comes from: built-in assets, a local folder, or the Hugging Face cache.

`builtin:NAME` names a folder shipped in qwen3lab/assets/models (no download ever). A hub id is read from the
local Hugging Face cache when present; nothing here goes to the network.

The 14B folders ship only config.json. Served with `load_format: dummy` (random weights), they (and their hub
ids) get a folder made locally: that config.json beside a tokenizer of exactly vocab_size ids, built from the
tiny tokenizer, so a GPU host without the hub runs them (`dummy_model_dir`).
"""
from __future__ import annotations

import json
import os
import tempfile
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


def _needs_hub_tokenizer(model: str) -> str | None:
    """The builtin name of a shipped architecture whose folder has no tokenizer (the 14B ones), else None."""
    name = model[len(BUILTIN_PREFIX):] if model.startswith(BUILTIN_PREFIX) else HUB_TO_BUILTIN.get(model)
    return name if name and BUILTINS.get(name, (None, None))[1] else None


def resolve_model_path(model: str, load_format: str | None = None) -> str:
    """What vLLM is given: built-in names become the shipped folder; with dummy weights a 14B builtin (or its
    hub id) becomes the local folder with a full-size tokenizer; anything else is passed as is."""
    if load_format == "dummy" and (name := _needs_hub_tokenizer(model)):
        return str(dummy_model_dir(name))
    if model.startswith(BUILTIN_PREFIX):
        return str(builtin_dir(model[len(BUILTIN_PREFIX):]))
    return model


def default_tokenizer(model: str, load_format: str | None = None) -> str | None:
    """A tokenizer for folders that ship only config.json (the 14B architecture folders): the hub's for real
    weights; none with dummy weights, whose local folder holds its own."""
    if load_format == "dummy" and _needs_hub_tokenizer(model):
        return None
    if model.startswith(BUILTIN_PREFIX):
        return BUILTINS.get(model[len(BUILTIN_PREFIX):], (None, None))[1]
    return None


# --- dummy-weight folders with a tokenizer made here ------------------------------------------------------

BPE_END = 151643  # first added-token id of Qwen2/Qwen3 tokenizers
QWEN3_SPECIALS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>", 151667: "<think>",
                  151668: "</think>"}
# Bump when the generated layout changes, so a stale folder is rebuilt.
_DUMMY_LAYOUT = 1


def cache_dir() -> Path:
    return Path(os.environ.get("QWEN3LAB_CACHE") or Path.home() / ".cache" / "qwen3lab")


def dummy_model_dir(name: str) -> Path:
    """A folder for `vllm serve --load-format dummy` of builtin `name`: its config.json and a tokenizer of exactly
    vocab_size ids (made once, under QWEN3LAB_CACHE or ~/.cache/qwen3lab)."""
    config = builtin_dir(name) / "config.json"
    out = cache_dir() / "dummy-models" / f"{name}-v{_DUMMY_LAYOUT}"
    if (out / "tokenizer.json").is_file() and (out / "config.json").read_bytes() == config.read_bytes():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{name}-"))
    write_padded_tokenizer(assets_dir() / "qwen3-tiny", config, tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process made it first: keep theirs
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_padded_tokenizer(tiny: Path, config_path: Path, out: Path) -> int:
    """The tiny byte-level BPE padded to the config's vocab_size, specials at Qwen3's ids, so every id the model
    can sample decodes (dummy weights sample any id). Layout: 0..8186 the tiny vocabulary; up to 151642 BPE
    fillers `<fN>` that no merge produces (encoding never emits them); 151643.. added tokens, Qwen3's specials
    at their ids and `<|fill_N|>` elsewhere. Returns the number of ids."""
    cfg = json.loads(config_path.read_text())
    vocab_size = int(cfg["vocab_size"])
    if cfg.get("bos_token_id") != 151643 or cfg.get("eos_token_id") != 151645:
        raise SpecError("engine.model", str(config_path), "a Qwen3 config.json (bos 151643, eos 151645)",
                        "dummy tokenizers are made for Qwen3 architectures only; give engine.tokenizer")
    tok = json.loads((tiny / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    base = len(vocab)
    for i in range(base, BPE_END):
        vocab[f"<f{i}>"] = i  # printable ASCII is itself in the byte-level alphabet: each filler decodes
    tok["added_tokens"] = [{"id": i, "content": QWEN3_SPECIALS.get(i, f"<|fill_{i}|>"), "single_word": False,
                            "lstrip": False, "rstrip": False, "normalized": False, "special": True}
                           for i in range(BPE_END, vocab_size)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    tc = json.loads((tiny / "tokenizer_config.json").read_text())
    tc["model_max_length"] = int(cfg.get("max_position_embeddings", 40960))
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 151643, "eos_token_id": [151645, 151643]}))
    (out / "config.json").write_bytes(config_path.read_bytes())
    return len(vocab) + len(tok["added_tokens"])


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
