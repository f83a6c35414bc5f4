"""The split topology (engine.topology): a short and a long vLLM server with `qwen3lab router` in front.

At run time the three are one `Server` to the runner: its URL is the router's, it is alive while all three are,
and its death names the one that died. On one GPU the servers start one after the other (each sizes its KV cache
from the memory it finds free), then the router; an ExitStack stops them in reverse on every exit path: errors,
Ctrl-C and SIGTERM alike. The same commands, as a bash script, are what the run stores and the export shows.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from qwen3lab import builds
from qwen3lab.errors import SpecError
from qwen3lab.experiment.spec import EngineConfig
from qwen3lab.measure import engine, router

PORTS = {"short": 8001, "long": 8002}  # of a pasted script: on one host, beside each other
ROUTER_PORT = 9000


def route_engines(config: EngineConfig, assigned: list[str] | None = None) -> dict[str, EngineConfig]:
    """Each route's server config, with its GPU (topology.gpus, on `assigned`: see route_devices) in its own
    CUDA_VISIBLE_DEVICES."""
    t = config.topology
    devices = route_devices(t.gpus, assigned) if t.gpus else None
    return {name: cfg.model_copy(update={"env": {**cfg.env, "CUDA_VISIBLE_DEVICES": devices[i]}}) if devices else cfg
            for i, (name, cfg) in enumerate(config.route_engines().items())}


def route_devices(gpus: tuple[int, int], assigned: list[str] | None = None) -> tuple[str, ...]:
    """Each route's CUDA_VISIBLE_DEVICES. Run here: topology.gpus as written. In a Ray task: the GPUs Ray
    assigned to it (as many as the distinct indices, ray_executor.gpus_needed), lowest index on the first id,
    so [0, 1] on Ray's ['3', '5'] is 3 and 5 and [1, 1] on ['6'] is 6 twice: never a GPU another task holds."""
    if not assigned:
        return tuple(str(g) for g in gpus)
    order = sorted(set(gpus))
    if len(assigned) < len(order):
        raise SpecError("engine.topology.gpus", list(gpus), f"at most {len(assigned)} distinct GPU(s): the ones "
                        f"assigned to this task ({', '.join(assigned)})", "reserve one GPU per distinct index "
                        "(ray_executor.gpus_needed does) or share one GPU (gpus: [0, 0])")
    return tuple(assigned[order.index(g)] for g in gpus)


def assigned_gpus() -> list[str] | None:
    """The GPU ids Ray assigned to the task this process runs (ray.get_gpu_ids(), in order); None outside a
    Ray task (a driver has none; a process that never imported ray is no task) or with no GPU."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    ids = [str(i) for i in ray.get_gpu_ids()]  # a set underneath: sorted, numbers as numbers
    return sorted(ids, key=lambda i: (len(i), i)) or None


def router_config(config: EngineConfig, routes: dict[str, str], host: str = "127.0.0.1",
                  port: int = ROUTER_PORT) -> router.RouterConfig:
    t = config.topology
    # The served model's tokenizer: builtin:NAME travels inside qwen3lab; anything else is what vLLM was given.
    return router.RouterConfig(routes, t.threshold_tokens, tokenizer=config.tokenizer or config.model,
                               policy=t.policy, host=host, port=port)


def shell_script(config: EngineConfig, build: engine.Build, router_command: tuple[str, ...] = ("qwen3lab",),
                 header: tuple[str, ...] | list[str] = ()) -> tuple[str, dict[str, engine.Launch], list[str]]:
    """A bash script: both servers in the background, the router in the foreground; Ctrl-C or the router's exit
    stops all three. Each line is `engine.shell_command`'s quoting, so any value survives bash."""
    launches = {name: engine.shell_launch(cfg, build, "127.0.0.1", PORTS[name])
                for name, cfg in route_engines(config).items()}
    rc = router_config(config, {n: f"http://127.0.0.1:{PORTS[n]}" for n in launches})
    router_argv = [*router_command, *rc.argv()[1:]]
    lines = ["#!/usr/bin/env bash", *(f"# {h}" for h in header), "set -euo pipefail",
             "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT  # the router's end stops both servers",
             f"{engine.shell_command(launches['short'])} &"]
    if config.topology.shares_gpu:
        lines.append(f"until curl -fsS -o /dev/null http://127.0.0.1:{PORTS['short']}/health; do sleep 2; done")
    lines += [f"{engine.shell_command(launches['long'])} &", " ".join(shlex.quote(a) for a in router_argv)]
    return "\n".join(lines) + "\n", launches, router_argv


@dataclass(eq=False)
class SplitServer(engine.Server):
    routes: dict[str, engine.Server] = field(default_factory=dict)
    router_process: subprocess.Popen | None = None
    router_log: Path | None = None

    def alive(self) -> bool:
        return all(s.alive() for s in self.routes.values()) and self.router_process.poll() is None

    def death(self) -> tuple[str, str]:
        for name, server in self.routes.items():
            if not server.alive():
                outcome, reason = server.death()
                return outcome, f"the {name} server: {reason}"
        tail = self.router_log.read_text(errors="replace").strip().splitlines()[-3:] if self.router_log else []
        return "crashed", f"the router exited ({self.router_process.poll()}): {' | '.join(tail)}"


def log_paths(config, log_path: str | os.PathLike) -> dict[str, Path]:
    """Every log a launch of `config` writes: `log_path` (the server's; a split topology's short server), and for a
    split topology `server-long.log` and `router.log` beside it."""
    log_path = Path(log_path)
    if getattr(config, "topology", None) is None:
        return {"server": log_path}
    return {"short": log_path, "long": log_path.with_name("server-long.log"),
            "router": log_path.with_name("router.log")}


@contextmanager
def launch(config: EngineConfig, log_path: str | os.PathLike, ready_timeout_s: float = 900.0) -> Iterator[SplitServer]:
    """Start short, long, then the router; yield them as one server; stop all three on the way out.
    Logs: see log_paths."""
    log_path = Path(log_path)
    logs = log_paths(config, log_path)
    with ExitStack() as stack:
        servers = {name: stack.enter_context(engine.launch(cfg, logs[name], ready_timeout_s))  # in order: long
                   for name, cfg in route_engines(config, assigned_gpus()).items()}  # starts once short is up
        rc = router_config(config, {n: s.base_url for n, s in servers.items()}, port=engine.free_port())
        running = stack.enter_context(router.launch(rc, logs["router"]))
        short, long = servers["short"], servers["long"]
        server = SplitServer(
            base_url=running.url, model_name=short.model_name, launch_command=launch_command(config),
            exec_argv=short.exec_argv, log_path=log_path, port=rc.port, build=short.build, routes=servers,
            router_process=running.process, router_log=running.log_path)
        server.info = {"version": short.info.get("version"), "max_model_len": long.info.get("max_model_len"),
                       "kv_cache_tokens": sum(s.info.get("kv_cache_tokens") or 0 for s in servers.values()) or None,
                       "routes": {n: dict(s.info, exec_argv=s.exec_argv) for n, s in servers.items()},
                       **attention_of(servers),
                       "router_argv": rc.argv(), "threshold_tokens": config.topology.threshold_tokens}
        yield server


def attention_of(servers: dict) -> dict:
    """The attention backend and FlashAttention version the routes' servers logged: the one value where they
    agree, else each route's (short:FLASH_ATTN long:TRITON_ATTN)."""
    out = {}
    for key in ("attention_backend", "flash_attn_version"):
        values = {s.info.get(key) for s in servers.values()}
        out[key] = values.pop() if len(values) == 1 else None
    if out["attention_backend"] is None and any(s.info.get("attention_backend") for s in servers.values()):
        out["attention_backend"] = " ".join(f"{n}:{s.info.get('attention_backend')}" for n, s in servers.items())
    return out


def launch_command(config: EngineConfig) -> str:
    """What a run stores to paste: the bash script of the three for a split topology, else engine's command."""
    if config.topology is None:
        return engine.launch_command(config)
    try:
        return shell_script(config, engine.probe_build(builds.python_of(config)))[0]
    except Exception:  # noqa: BLE001 - no build to probe: the readable form; the launch then says why
        return config.to_shell()


def open_engine(config, log_path: str | os.PathLike, ready_timeout_s: float = 900.0):
    """engine.open_engine, and for a split topology its two servers and the router as one."""
    if getattr(config, "topology", None) is not None:
        return launch(config, log_path, ready_timeout_s)
    return engine.open_engine(config, log_path, ready_timeout_s)


def added_latency(server: SplitServer, requests: list, workload, pairs: int = 16) -> dict:
    """The router's own cost on TTFT: short-route requests sent one at a time straight to the short server and
    through the router, in pairs. Each pair sends one request both ways, in alternating order: the second of
    a pair finds its prompt in the prefix cache, and alternating cancels that from the mean difference."""
    from qwen3lab.measure.loadgen import run_load, run_sync

    threshold = server.info.get("threshold_tokens")
    # TTFT is what is compared: a few output tokens keep the probe to seconds, whatever the mix asks for.
    chosen = [dataclasses.replace(r, output_tokens=min(r.output_tokens, 4))
              for r in requests if threshold is None or r.prompt_tokens <= threshold][:pairs]
    if not chosen:
        return {}
    one = workload.model_copy(update={"concurrency": 1, "request_rate": None, "warmup_requests": 0,
                                      "duration_s": None, "num_requests": 1})
    diffs = []
    for i, req in enumerate(chosen):
        ways = [server.routes["short"].base_url, server.base_url]
        got = {}
        for url in ways if i % 2 == 0 else ways[::-1]:
            rec = run_sync(run_load(url, server.model_name, [req], one)).records[0]
            got[url] = rec.ttft if rec.ok else None
        if None not in got.values():
            diffs.append(got[server.base_url] - got[ways[0]])
    if not diffs:
        return {}
    import numpy as np

    ms = np.array(diffs) * 1000
    return {"router_added_ttft_mean_ms": float(ms.mean()), "router_added_ttft_median_ms": float(np.median(ms)),
            "router_added_ttft_pairs": len(ms)}
