"""scripts/network.sh adds exactly its isolation rule and removes exactly that rule (marked
``docker``: it needs root and iptables, which the engine set-up installs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests

from gpuspawner.testing.hubrunner import Hub
from gpuspawner.testing.waiting import wait_until

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


@pytest.mark.exclusive  # compares the whole FORWARD chain before and after
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


RULE = ["FORWARD", "-s", "198.18.0.0/15", "-d", "198.18.0.0/15", "-m", "comment",
        "--comment", "gpuspawner-isolation", "-j", "DROP"]  # scripts/network.sh's default


def rule_present() -> bool:
    return subprocess.run(["iptables", "-C", *RULE], capture_output=True).returncode == 0


def restore_rule() -> None:
    """Put the project's isolation rule back (scripts/network.sh, idempotent), within 30 s.
    Raises AssertionError when it is still missing."""
    deadline = time.monotonic() + 30
    while not rule_present() and time.monotonic() < deadline:
        subprocess.run([str(REPO / "scripts" / "network.sh")], timeout=30, capture_output=True,
                       env={k: v for k, v in os.environ.items()
                            if k != "GPUSPAWNER_NETWORK_POOL"})
    assert rule_present(), "the isolation rule could not be restored: run scripts/network.sh"


@pytest.mark.hub
@pytest.mark.exclusive  # every hub on this host refuses spawns while the rule is gone
def test_a_node_without_the_isolation_rule_takes_no_new_servers(tmp_path: Path):
    """Issue 46 item 8: after a reboot the rule of scripts/network.sh was gone and nothing
    noticed: servers reached each other. Now the hub reads the host's FORWARD chain at start,
    every minute and (at most every 2 s) at a spawn; a node whose server networks no rule
    isolates takes no new servers, with a message naming the node and the command that
    restores the rule; once the rule is back it takes them again.

    The rule is removed for the shortest time this takes (one refused spawn; other tests on
    this host rely on it) and put back in a ``finally``."""
    from tests.test_hub_e2e import _engine, remove_objects_of

    engine = _engine()
    if not rule_present():
        pytest.skip("the isolation rule is not there to begin with (scripts/network.sh)")
    user = "isolation-check"
    hub = Hub(tmp_path / "hub", [{"name": "local", "topology": "auto"}],
              [{"slug": "cpu", "cpu": 1, "memory": "256M", "default": True}],
              extra_config="")
    hub.env["GPUSPAWNER_CULLER"] = "off"
    hub.start()
    try:
        hub.ensure_user(user)
        t0 = time.monotonic()
        try:
            subprocess.run(["iptables", "-D", *RULE], check=True, timeout=10)
            try:  # a refusal comes at once; a spawn that goes on is not waited for
                r = hub.api("POST", f"/users/{user}/server", {"profile": "cpu"}, timeout=5)
            except requests.Timeout:
                r = None
        finally:
            restore_rule()
        print(f"the rule was missing for {time.monotonic() - t0:.2f} s")
        assert r is not None, "the spawn was not refused (still starting after 5 s)"
        assert r.status_code == 503, (r.status_code, r.text, hub.tail(30))
        message = r.json()["message"]
        assert "the isolation firewall rule is missing on node local" in message, message
        assert "scripts/network.sh on local" in message, message
        assert not engine.containers(all=True, filters={"label": f"gpuspawner.user={user}"})
        assert "the isolation firewall rule is missing on node local" in hub.tail(200)

        def spawned() -> bool:  # the rule is back: the node takes servers again
            r = hub.api("POST", f"/users/{user}/server", {"profile": "cpu"}, timeout=30)
            if r.status_code in (201, 202):
                return True
            assert r.status_code == 503 and "isolation" in r.json()["message"], r.text
            return False

        wait_until(spawned, 20, 0.5, "a spawn accepted once the rule is back")
        hub.wait_ready(user)
        assert "the isolation rule is back" in hub.tail(200)
    finally:
        restore_rule()
        try:
            hub.api("DELETE", f"/users/{user}/server")
            hub.wait_stopped(user)
        except Exception:
            pass
        hub.stop()
        remove_objects_of(engine, [user])
