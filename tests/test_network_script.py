"""scripts/network.sh adds exactly its isolation rule and removes exactly that rule (marked
``docker``: it needs root and iptables, which the engine set-up installs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.docker,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("iptables"),
                                 reason="needs root and iptables (make engine)")]


def forward_rules() -> list[str]:
    out = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if line.startswith("-A FORWARD")]


def run(*args: str, pool: str) -> None:
    subprocess.run([str(REPO / "scripts" / "network.sh"), *args], check=True, timeout=60,
                   env={**os.environ, "GPUSPAWNER_NETWORK_POOL": pool}, capture_output=True)


def test_adds_and_removes_exactly_its_rule():
    pool = "198.19.254.0/24"  # a pool no other test uses
    before = forward_rules()
    run(pool=pool)
    run(pool=pool)  # idempotent: one rule, not two
    added = [r for r in forward_rules() if r not in before]
    assert added == [f"-A FORWARD -s {pool} -d {pool} -m comment --comment "
                     "gpuspawner-isolation -j DROP"], added
    run("--stop", pool=pool)
    assert forward_rules() == before  # the project's own default rule and others untouched
