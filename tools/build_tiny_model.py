"""Rebuild the embedded tiny Qwen3 model (config + tokenizer) shipped in qwen3lab/assets/models/qwen3-tiny.

Run once by a maintainer; the output is committed so no user ever downloads anything. The tokenizer is a
byte-level BPE (the same family as Qwen3's) trained on this Python's standard-library source, so it is
rebuilt identically from the same interpreter version.
"""
from __future__ import annotations

import json
import pathlib
import sysconfig

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

OUT = pathlib.Path(__file__).resolve().parents[1] / "qwen3lab" / "assets" / "models" / "qwen3-tiny"
VOCAB = 8192
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

# Qwen3's own template, reduced to what the workbook uses: roles, and enable_thinking=False inserting an
# empty think block exactly as Qwen3-14B's template does.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def corpus():
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
        yield path.read_text(encoding="utf-8", errors="ignore")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(SPECIAL), special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_special_tokens(SPECIAL)
    tok.save(str(OUT / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL}
    (OUT / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2TokenizerFast",
        "model_max_length": 40960,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "vocab_size": VOCAB,
        # Same native window and rope_theta as Qwen3-14B, so the same YaRN rules apply to the tiny model.
        "max_position_embeddings": 40960,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 4,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
    }
    (OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (OUT / "generation_config.json").write_text(json.dumps({
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
    }, indent=2) + "\n")
    print(f"wrote {OUT} (vocab {tok.get_vocab_size()})")


if __name__ == "__main__":
    main()
