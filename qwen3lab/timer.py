"""`qwen3lab schedule`: the sweep of an experiment on a timer, as a systemd service + timer, a crontab line, or a
Kubernetes CronJob beside `qwen3lab k8s`'s RayCluster.

Every target runs the same guarded command (`python -m qwen3lab.timer --lock L --log F -- qwen3lab sweep ...`,
this module's `main`): it takes an exclusive lock beside the database, so two scheduled sweeps never write one
DuckDB at once (a run that finds the lock held logs that it skipped and leaves), and appends the sweep's output
with a start and an end line to a log file. The sweep itself resumes: trials already stored are not run again.
"""
from __future__ import annotations

import fcntl
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from qwen3lab.errors import Qwen3LabError, SpecError

TARGETS = ("systemd", "cron", "k8s")
_EVERY = re.compile(r"(\d+)([mhd])")
_AT = re.compile(r"([01]?\d|2[0-3]):([0-5]\d)")
_DOW = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
CRON_MARK = "# qwen3lab-schedule:"  # the tag of our crontab line, so --install replaces it instead of adding one
SKIPPED = 75  # EX_TEMPFAIL: the lock was held, this run did nothing


@dataclass(frozen=True)
class When:
    cron: str  # five fields: minute hour day-of-month month day-of-week
    on_calendar: str  # systemd's OnCalendar= for the same times


def parse_every(every: str, at: str | None = None) -> When:
    """1d (daily at --at, default 02:00), Nh (every N hours, at --at's minute), Nm (every N minutes), or a
    five-field cron expression."""
    every = every.strip()
    if len(every.split()) == 5:
        if at:
            raise SpecError("--at", at, "only with --every Nd or Nh", "put the time in the cron expression")
        return When(every, cron_to_calendar(every))
    m = _EVERY.fullmatch(every)
    limits = {"m": (1, 59), "h": (1, 23), "d": (1, 1)}
    if not m or not limits[m[2]][0] <= int(m[1]) <= limits[m[2]][1]:
        raise SpecError("--every", every, "1d, 1h..23h, 1m..59m, or five cron fields ('30 2 * * 1-5')",
                        "e.g. --every 1d --at 02:00, --every 6h, --every '0 3 * * 0'")
    n, unit = int(m[1]), m[2]
    a = _AT.fullmatch(at or "02:00")
    if not a:
        raise SpecError("--at", at, "HH:MM, 24-hour", "e.g. --at 02:00")
    hour, minute = int(a[1]), int(a[2])
    if unit == "m":
        if at:
            raise SpecError("--at", at, "only with --every Nd or Nh", "drop --at")
        return When(f"*/{n} * * * *", f"*-*-* *:0/{n}:00")
    if unit == "h":
        return When(f"{minute} {hour % n}-23/{n} * * *", f"*-*-* {hour % n:02d}/{n}:{minute:02d}:00")
    return When(f"{minute} {hour} * * *", f"*-*-* {hour:02d}:{minute:02d}:00")


def _calendar_field(value: str, first: int, what: str) -> str:
    """One cron field in systemd's calendar syntax: lists stay, a-b is a..b, */n is first/n, a-b/n is a..b/n."""
    out = []
    for part in value.split(","):
        base, _, step = part.partition("/")
        if base == "*":
            base = str(first) if step else "*"
        elif "-" in base:
            lo, hi = base.split("-", 1)
            base = f"{lo}..{hi}"
        if not re.fullmatch(r"\*|\d+(\.\.\d+)?", base) or (step and not step.isdigit()):
            raise SpecError("--every", value, f"a cron {what} field of numbers, a-b, */n, a-b/n and lists",
                            "write the expression with numbers (names such as MON are not read)")
        out.append(f"{base}/{step}" if step else base)
    return ",".join(out)


def cron_to_calendar(expr: str) -> str:
    minute, hour, dom, month, dow = expr.split()
    if dom != "*" and dow != "*":
        raise SpecError("--every", expr, "a day of the month or a day of the week, not both",
                        "cron runs on either day and systemd only on both: keep one (or use two schedules)")
    days = ""
    if dow != "*":
        names = []
        for part in dow.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()) or int(hi or lo) > 7:
                raise SpecError("--every", expr, "a day-of-week field of 0-7, a-b and lists", "e.g. 1-5 for Monday to Friday")
            names.append(f"{_DOW[int(lo)]}..{_DOW[int(hi)]}" if hi else _DOW[int(lo)])
        days = ",".join(names) + " "
    parts = [_calendar_field(f, first, what) for f, first, what in
             ((month, 1, "month"), (dom, 1, "day-of-month"), (hour, 0, "hour"), (minute, 0, "minute"))]
    return f"{days}*-{parts[0]}-{parts[1]} {parts[2]}:{parts[3]}:00"


@dataclass(frozen=True)
class Job:
    """What runs: the experiment's sweep on one database, from a working directory, guarded and logged."""

    name: str  # qwen3lab-EXPERIMENT: the unit, the crontab tag, the Kubernetes objects
    experiment: Path
    db: Path
    log: Path
    workdir: Path
    python: str
    only: tuple[str, ...] = ()

    @property
    def lock(self) -> Path:
        return self.db.with_name(self.db.name + ".schedule.lock")

    def sweep_argv(self) -> list[str]:
        return [self.python, "-m", "qwen3lab", "sweep", str(self.experiment), "--db", str(self.db),
                "--runs-dir", str(self.db.parent / "runs"), *(f"--only={c}" for c in self.only)]

    def argv(self) -> list[str]:
        return [self.python, "-m", "qwen3lab.timer", "--lock", str(self.lock), "--log", str(self.log), "--",
                *self.sweep_argv()]

    def shell(self) -> str:
        return f"cd {shlex.quote(str(self.workdir))} && {shlex.join(self.argv())}"


def job(experiment: str | Path, db: str | Path, log: str | Path | None = None, only: tuple[str, ...] = (),
        python: str | None = None, workdir: str | Path | None = None) -> Job:
    """The job for an experiment file; the file is read (and refused when it is not an experiment) first."""
    from qwen3lab.experiment import files as xp
    from qwen3lab.kuberay import _name

    experiment = Path(experiment).absolute()
    exp = xp.load(experiment)
    db = Path(db).absolute()
    return Job(_name(exp.name), experiment, db, Path(log).absolute() if log else db.with_suffix(".schedule.log"),
               Path(workdir or os.getcwd()).absolute(), python or sys.executable, tuple(only))


def systemd_units(j: Job, when: When) -> dict[str, str]:
    """NAME.service (one sweep, oneshot) and NAME.timer (Persistent: a run missed while the machine was off runs
    at the next boot)."""
    service = (f"[Unit]\nDescription=qwen3lab sweep of {j.experiment.name} into {j.db.name}\n"
               "Wants=network-online.target\nAfter=network-online.target\n\n"
               f"[Service]\nType=oneshot\nWorkingDirectory={j.workdir}\n"
               f"Environment=PYTHONUNBUFFERED=1\nExecStart={shlex.join(j.argv())}\n"
               f"SuccessExitStatus={SKIPPED}\n")
    timer = (f"[Unit]\nDescription=qwen3lab sweep of {j.experiment.name} on a timer\n\n"
             f"[Timer]\nOnCalendar={when.on_calendar}\nPersistent=true\nUnit={j.name}.service\n\n"
             "[Install]\nWantedBy=timers.target\n")
    return {f"{j.name}.service": service, f"{j.name}.timer": timer}


def cron_line(j: Job, when: When) -> str:
    return f"{when.cron} {j.shell()} {CRON_MARK}{j.name}\n"


KUBECTL_IMAGE = "registry.k8s.io/kubectl:v1.33.0"


def cronjob(experiment: str | Path, when: When, namespace: str | None = None,
            kubectl_image: str = KUBECTL_IMAGE) -> list[dict]:
    """A CronJob that starts the sweep as a RayJob on `qwen3lab k8s`'s RayCluster, where the experiment's
    ConfigMap and the DuckDB's volume already are; its ServiceAccount may create RayJobs and nothing else.
    concurrencyPolicy Forbid keeps one launcher at a time, and the lock on the volume one sweep at a time."""
    import json

    from qwen3lab.experiment import files as xp
    from qwen3lab.kuberay import CONFIG_DIR, DATA_DIR, _name

    name = _name(xp.load(experiment).name)
    meta = {"labels": {"app.kubernetes.io/name": "qwen3lab", "qwen3lab/experiment": name}}
    if namespace:
        meta["namespace"] = namespace
    db = f"{DATA_DIR}/qwen3lab.duckdb"
    guarded = ["python", "-m", "qwen3lab.timer", "--lock", f"{db}.schedule.lock", "--log",
               f"{DATA_DIR}/schedule.log", "--", "qwen3lab", "sweep", f"{CONFIG_DIR}/experiment.yaml",
               "--executor", "ray", "--address", "auto", "--db", db, "--runs-dir", f"{DATA_DIR}/runs"]
    # generateName: each firing creates a RayJob of its own (`kubectl create`, not apply)
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"generateName": f"{name}-scheduled-", **meta},
              "spec": {"clusterSelector": {"ray.io/cluster": name}, "entrypoint": shlex.join(guarded),
                       "ttlSecondsAfterFinished": 86400}}
    account = f"{name}-scheduler"
    launcher = {"name": "launch", "image": kubectl_image, "command": ["kubectl", "create", "-f", "/job/rayjob.json"],
                "volumeMounts": [{"name": "rayjob", "mountPath": "/job", "readOnly": True}]}
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-scheduled-rayjob", **meta},
         "data": {"rayjob.json": json.dumps(rayjob, indent=2)}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, **meta}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": account, **meta},
         "rules": [{"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": account, **meta},
         "subjects": [{"kind": "ServiceAccount", "name": account, **({"namespace": namespace} if namespace else {})}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account}},
        {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": f"{name}-schedule", **meta},
         "spec": {"schedule": when.cron, "concurrencyPolicy": "Forbid", "startingDeadlineSeconds": 3600,
                  "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 3,
                  "jobTemplate": {"spec": {"backoffLimit": 2, "template": {"spec": {
                      "serviceAccountName": account, "restartPolicy": "OnFailure", "containers": [launcher],
                      "volumes": [{"name": "rayjob", "configMap": {"name": f"{name}-scheduled-rayjob"}}]}}}}}},
    ]


def render(target: str, experiment: str | Path, every: str, at: str | None = None, db: str | Path = "qwen3lab.duckdb",
           log: str | Path | None = None, only: tuple[str, ...] = (), namespace: str | None = None,
           kubectl_image: str = KUBECTL_IMAGE) -> dict[str, str]:
    """The files of a schedule, by file name: what `qwen3lab schedule` prints, writes or installs."""
    from qwen3lab import kuberay

    if target not in TARGETS:
        raise SpecError("--target", target, ", ".join(TARGETS), "pick one of them")
    when = parse_every(every, at)
    if target == "k8s":
        docs = cronjob(experiment, when, namespace, kubectl_image)
        head = (f"# qwen3lab schedule {experiment} --every {every} --target k8s: a CronJob starting the sweep as a "
                "RayJob\n# on the RayCluster of `qwen3lab k8s` (apply that first; its volume holds the DuckDB and "
                "schedule.log).\n")
        return {f"{docs[-1]['metadata']['name']}.yaml": head + kuberay.yaml_text(docs)}
    j = job(experiment, db, log, only)
    return systemd_units(j, when) if target == "systemd" else {f"{j.name}.cron": cron_line(j, when)}


def main(argv: list[str] | None = None) -> int:
    """The guarded run: `python -m qwen3lab.timer --lock L --log F -- COMMAND...`."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        split = args.index("--")
        opts, command = dict(zip(args[:split:2], args[1:split:2])), args[split + 1:]
        lock, log = Path(opts["--lock"]), Path(opts["--log"])
    except (ValueError, KeyError):
        print("usage: python -m qwen3lab.timer --lock FILE --log FILE -- COMMAND...", file=sys.stderr)
        return 2
    log.parent.mkdir(parents=True, exist_ok=True)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", buffering=1) as out, open(lock, "a+") as held:
        stamp = lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # noqa: E731
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.seek(0)
            out.write(f"{stamp()} skipped: {lock} is held by another run ({held.read().strip() or 'pid unknown'})\n")
            return SKIPPED
        held.seek(0)
        held.truncate()
        held.write(f"pid {os.getpid()} since {stamp()}")
        held.flush()
        out.write(f"{stamp()} start: {shlex.join(command)}\n")
        try:
            rc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
        except OSError as exc:
            out.write(f"{stamp()} cannot start: {exc}\n")
            return 127
        out.write(f"{stamp()} end: exit code {rc}\n")
        held.truncate(0)  # the lock file names its holder only while held
        return rc


def install(target: str, files: dict[str, str], name: str) -> str:
    """Put the files where the target reads them and switch the schedule on; says where, or raises with why."""
    def run(*argv: str, text_in: str | None = None) -> str:
        try:
            got = subprocess.run(argv, input=text_in, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:
            raise Qwen3LabError(f"{argv[0]} cannot run here ({exc}). Fix: write the files with --out and install "
                                "them by hand, or pick another --target") from exc
        if got.returncode != 0 and not (argv[:2] == ("crontab", "-l") and "no crontab" in got.stderr):
            raise Qwen3LabError(f"{' '.join(argv)} failed: {got.stderr.strip()[:400]}. Fix: write the files with "
                                "--out and install them by hand, or pick another --target")
        return got.stdout

    if target == "systemd":
        user = os.geteuid() != 0
        where = Path.home() / ".config/systemd/user" if user else Path("/etc/systemd/system")
        ctl = ["systemctl", *(["--user"] if user else [])]
        run(*ctl, "--version")  # no systemctl: nothing written
        where.mkdir(parents=True, exist_ok=True)
        for file, text in files.items():
            (where / file).write_text(text)
        try:
            run(*ctl, "daemon-reload")
            run(*ctl, "enable", "--now", f"{name}.timer")
        except Qwen3LabError:
            for file in files:  # not switched on: leave no unit behind
                (where / file).unlink(missing_ok=True)
            raise
        return f"{where}: {name}.timer enabled ({' '.join(ctl)} list-timers shows the next run)"
    if target == "cron":
        kept = [line for line in run("crontab", "-l").splitlines(keepends=True) if not line.rstrip().endswith(CRON_MARK + name)]
        run("crontab", "-", text_in="".join(kept) + "".join(files.values()))
        return "the crontab of this user (crontab -l shows it)"
    (text,) = files.values()
    run("kubectl", "apply", "-f", "-", text_in=text)
    return "the current kubectl context (kubectl get cronjobs)"


if __name__ == "__main__":
    sys.exit(main())
