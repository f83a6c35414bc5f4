"""`qwen3lab schedule`: the systemd units checked by systemd itself, the crontab line executed the way cron runs
it (against the session's server, one small endpoint trial), the lock refusing a second run, and the CronJob
schema-checked as tests/test_kuberay.py checks the KubeRay manifests."""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys

import duckdb
import kubernetes_validate
import pytest
import yaml

from qwen3lab import timer as schedule
from qwen3lab.errors import SpecError
from qwen3lab.kuberay import CONFIG_DIR, DATA_DIR

from .conftest import REPO
from .test_kuberay import K8S_VERSION, crd_errors

EXPERIMENT = REPO / "experiments" / "cpu-tiny.yaml"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.parametrize("every, at, cron, calendar", [
    ("1d", None, "0 2 * * *", "*-*-* 02:00:00"),
    ("1d", "23:45", "45 23 * * *", "*-*-* 23:45:00"),
    ("6h", "02:30", "30 2-23/6 * * *", "*-*-* 02/6:30:00"),
    ("15m", None, "*/15 * * * *", "*-*-* *:0/15:00"),
    ("0 3 * * 1-5", None, "0 3 * * 1-5", "Mon..Fri *-*-* 3:0:00"),
    ("*/10 8-18 1,15 * *", None, "*/10 8-18 1,15 * *", "*-*-1,15 8..18:0/10:00"),
    ("5 4 * 1-6/2 0,6", None, "5 4 * 1-6/2 0,6", "Sun,Sat *-1..6/2-* 4:5:00"),
])
def test_every_gives_a_cron_expression_and_a_calendar_systemd_accepts(every, at, cron, calendar):
    when = schedule.parse_every(every, at)
    assert (when.cron, when.on_calendar) == (cron, calendar)
    if not SYSTEMD_ANALYZE:
        pytest.skip("systemd-analyze is not installed: the calendar is not checked by systemd here")
    got = subprocess.run([SYSTEMD_ANALYZE, "calendar", when.on_calendar], capture_output=True, text=True)
    assert got.returncode == 0 and "Next elapse" in got.stdout, got.stdout + got.stderr


@pytest.mark.parametrize("every, at, field", [("2d", None, "--every"), ("25h", None, "--every"), ("daily", None, "--every"),
                                              ("1d", "24:00", "--at"), ("10m", "02:00", "--at"),
                                              ("0 3 * * *", "02:00", "--at"), ("0 3 * * MON", None, "--every"),
                                              ("0 3 1 * 1", None, "--every")])
def test_a_bad_schedule_is_refused_naming_the_option(every, at, field):
    with pytest.raises(SpecError) as caught:
        schedule.parse_every(every, at)
    assert caught.value.field == field and "Fix:" in str(caught.value)


def test_systemd_units_pass_systemd_analyze_verify(tmp_path):
    files = schedule.render("systemd", EXPERIMENT, "6h", "01:15", tmp_path / "lab.duckdb")
    assert sorted(files) == ["qwen3lab-cpu-tiny.service", "qwen3lab-cpu-tiny.timer"]
    timer = files["qwen3lab-cpu-tiny.timer"]
    assert "OnCalendar=*-*-* 01/6:15:00" in timer and "Persistent=true" in timer
    service = files["qwen3lab-cpu-tiny.service"]
    assert f"--lock {tmp_path}/lab.duckdb.schedule.lock" in service and f"sweep {EXPERIMENT}" in service
    if not SYSTEMD_ANALYZE:
        pytest.skip("systemd-analyze is not installed: the units are not verified by systemd here")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    got = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", *(str(tmp_path / n) for n in files)],
                         capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    # the check can fail: the same service with a command that does not exist is refused
    (tmp_path / "broken.service").write_text(service.replace("ExecStart=", "ExecStart=/nonexistent/python "))
    bad = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(tmp_path / "broken.service")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "nonexistent" in bad.stderr


def cron_command(line: str) -> str:
    """What cron hands /bin/sh: the line without its five time fields (cron would cut at a bare %)."""
    assert "%" not in line
    return line.split(None, 5)[5]


def test_the_crontab_line_runs_the_sweep_locked_logged_and_resumable(tiny_server, tmp_path):
    """The line is executed as cron does (/bin/sh, an almost empty environment): the sweep measures one endpoint
    trial into the DuckDB and logs its start and end; with the lock held by another run, the same line logs that
    it skipped and measures nothing."""
    from qwen3lab.models import resolve_model_path

    path = tmp_path / "nightly.yaml"
    path.write_text(f"name: nightly\ngpu: cpu\n"
                    f"engine: {{kind: endpoint, url: '{tiny_server.base_url}', model: '{tiny_server.model_name}', "
                    f"tokenizer: '{resolve_model_path('builtin:qwen3-tiny')}'}}\n"
                    "workload: {num_requests: 3, warmup_requests: 0, mix: fixed-128, concurrency: 1}\n"
                    "chapters:\n  baseline:\n    trials: [{name: nightly}]\n")
    db, log = tmp_path / "lab.duckdb", tmp_path / "schedule.log"
    j = schedule.job(path, db, log, only=("baseline",), python=sys.executable, workdir=REPO)
    line = schedule.cron_line(j, schedule.parse_every("1d", "03:00"))
    assert line.startswith("0 3 * * * cd ") and line.rstrip().endswith("# qwen3lab-schedule:qwen3lab-nightly")
    cron_env = {"PATH": "/usr/bin:/bin", "HOME": os.environ["HOME"], "SHELL": "/bin/sh", "LOGNAME": "root"}
    got = subprocess.run(["/bin/sh", "-c", cron_command(line)], env=cron_env, capture_output=True, text=True,
                         timeout=600)
    text = log.read_text()
    assert got.returncode == 0, text[-3000:]
    assert "start: " in text and "end: exit code 0" in text, text[-3000:]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT trial, status FROM runs").fetchall() == [("nightly", "ok")]
        assert con.sql("SELECT count(*) FROM requests").fetchall() == [(3,)]

    with open(j.lock, "a+") as held:  # another run holds the database
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        again = subprocess.run(["/bin/sh", "-c", cron_command(line)], env=cron_env, capture_output=True, timeout=120)
    assert again.returncode == schedule.SKIPPED
    assert log.read_text().splitlines()[-1].endswith(f"skipped: {j.lock} is held by another run (pid unknown)")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT count(*) FROM runs").fetchall() == [(1,)]


def test_the_guard_logs_a_failing_command_and_passes_its_exit_code(tmp_path):
    log, lock = tmp_path / "s.log", tmp_path / "s.lock"
    rc = schedule.main(["--lock", str(lock), "--log", str(log), "--", sys.executable, "-c",
                        "import sys; print('partial output'); sys.exit(3)"])
    text = log.read_text()
    assert rc == 3 and "partial output" in text and text.rstrip().endswith("end: exit code 3")
    assert schedule.main(["--log", str(log)]) == 2  # no lock, no command: usage, nothing run


def test_the_cronjob_passes_kubernetes_schemas_and_its_rayjob_the_crd(tmp_path):
    (text,) = schedule.render("k8s", EXPERIMENT, "1d", "04:00", namespace="lab").values()
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs] == ["ConfigMap", "ServiceAccount", "Role", "RoleBinding", "CronJob"]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    cron = docs[-1]["spec"]
    assert cron["schedule"] == "0 4 * * *" and cron["concurrencyPolicy"] == "Forbid"
    # the RayJob each firing creates: KubeRay's own CRD schema, on qwen3lab k8s's cluster, volume and ConfigMap
    rayjob = yaml.safe_load(docs[0]["data"]["rayjob.json"])
    assert crd_errors(rayjob) == []
    assert rayjob["spec"]["clusterSelector"] == {"ray.io/cluster": "qwen3lab-cpu-tiny"}
    entry = rayjob["spec"]["entrypoint"]
    assert f"--lock {DATA_DIR}/qwen3lab.duckdb.schedule.lock" in entry and f"sweep {CONFIG_DIR}/experiment.yaml" in entry
    assert docs[2]["rules"] == [{"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["create"]}]
    # the check can fail: a CronJob with a field Kubernetes does not have is refused
    docs[-1]["spec"]["everyNight"] = True
    with pytest.raises(Exception):
        kubernetes_validate.validate(docs[-1], K8S_VERSION, strict=True)


def test_install_without_the_tool_says_why_and_how(tmp_path, monkeypatch):
    """--install where crontab is missing (this test's PATH has none) names the tool and the fix."""
    from qwen3lab.errors import Qwen3LabError

    monkeypatch.setenv("PATH", str(tmp_path))
    files = schedule.render("cron", EXPERIMENT, "1d", None, tmp_path / "lab.duckdb")
    with pytest.raises(Qwen3LabError, match=r"crontab cannot run here .*Fix: write the files with --out"):
        schedule.install("cron", files, "qwen3lab-cpu-tiny")
