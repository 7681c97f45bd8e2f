"""Slurm's ``PrivateData`` on the test cluster (issue 47, item 5): every user saw every job's
details (``squeue``, ``scontrol show job``: Comment, AdminComment with the allocation, StdOut,
WorkDir). ``scripts/slurm.sh`` writes ``PrivateData=jobs,usage,users``: another user sees none
of a user's jobs, while root (the hub) still sees them all."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gpuspawner.testing.slurm_hub import OTHER, USER
from tests.test_slurm_backend import slurm_conf  # noqa: F401
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[1]


def test_slurm_conf_keeps_jobs_usage_and_users_private(tmp_path: Path) -> None:
    """``--print-config`` (no daemons, no root) writes PrivateData with jobs, usage, users."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm.sh"), "--print-config"], capture_output=True,
        text=True, timeout=60,
        env={**os.environ, "PYTHON": sys.executable, "GPUSPAWNER_VAR": str(tmp_path / "var")})
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PrivateData=")]
    assert len(lines) == 1, proc.stdout
    assert {"jobs", "usage", "users"} <= set(lines[0].split("=", 1)[1].split(","))


def _as(user: str, conf: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", *cmd], capture_output=True, text=True,
                          timeout=30, env={"PATH": os.environ["PATH"], "SLURM_CONF": conf})


@pytest.mark.slurm
# was a hole: PrivateData was not set, so any user read every job's Comment (the port, before
# the port report), AdminComment (allocation, user, GPUs), StdOut and WorkDir
def test_another_user_does_not_see_a_users_job(slurm_conf: str) -> None:  # noqa: F811
    """A held job of gpsuser1 (submitted by root as the hub does, with a Comment): gpsuser1
    and root see it; gpsuser2's ``squeue`` lists nothing of it and ``scontrol show job`` is
    refused."""
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": slurm_conf}
    secret = f"gps-private-{uuid.uuid4().hex[:8]}"
    out = subprocess.run(
        ["sbatch", "--parsable", "--hold", f"--uid={USER}", f"--gid={USER}",
         f"--job-name={secret}", f"--comment={secret}", "--output=/dev/null", "--chdir=/tmp",
         "--wrap=sleep 60"], capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    try:
        root = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i|%u|%k"],
                              capture_output=True, text=True, timeout=30, env=env)
        assert root.stdout.split() == [f"{job_id}|{USER}|{secret}"], root
        own = _as(USER, slurm_conf, "squeue", "-h", "-u", USER, "-o", "%i|%k")
        assert f"{job_id}|{secret}" in own.stdout.split(), own

        other = _as(OTHER, slurm_conf, "squeue", "-h", "-u", USER, "-o", "%i|%k")
        assert job_id not in other.stdout and secret not in other.stdout, other.stdout
        every = _as(OTHER, slurm_conf, "squeue", "-h", "-a", "-o", "%i|%k")
        assert job_id not in every.stdout and secret not in every.stdout, every.stdout
        shown = _as(OTHER, slurm_conf, "scontrol", "show", "job", job_id)
        assert secret not in shown.stdout and shown.returncode != 0, shown
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30, env=env)
        wait_until(lambda: job_id not in subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True,
            timeout=30, env=env).stdout, timeout=30, interval=0.3,
            message=f"job {job_id} gone")
