"""Elastic nodes on the Slurm backend without a cluster (gpuspawner/elastic/slurm.py): Slurm's
node states read as power states, powered-down nodes taken as resumable by the backend, and
the providers refused at hub start (provider "slurm" needs the Slurm backend and the Slurm
backend needs it)."""

from __future__ import annotations

import pytest

from gpuspawner.backends.slurm.commands import parse_node_state, parse_nodes
from gpuspawner.elastic.slurm import check_slurm_providers, slurm_power_state


@pytest.mark.parametrize(("text", "power"), [
    ("IDLE+CLOUD+POWERED_DOWN", "off"),
    ("IDLE+CLOUD+POWERING_DOWN", "off"),
    ("ALLOCATED+CLOUD+NOT_RESPONDING+POWERING_UP", "starting"),
    ("IDLE+CLOUD", "running"),
    ("MIXED", "running"),
    ("DOWN+CLOUD+POWERED_DOWN+NOT_RESPONDING", "down"),  # a resume past ResumeTimeout
    ("IDLE+DRAIN+POWERED_DOWN", "down"),
])
def test_power_states(text: str, power: str) -> None:
    assert slurm_power_state(*parse_node_state(text)) == power


def test_a_powered_down_node_is_resumable_a_down_one_is_not() -> None:
    def node(state: str):
        (info,) = parse_nodes(f"NodeName=node4 State={state} CPUTot=1 RealMemory=1000\n")
        return info

    assert node("IDLE+CLOUD+POWERED_DOWN").resumable
    assert node("ALLOCATED+CLOUD+NOT_RESPONDING+POWERING_UP").resumable
    assert not node("ALLOCATED+CLOUD+NOT_RESPONDING+POWERING_UP").usable
    assert not node("DOWN+CLOUD+POWERED_DOWN+NOT_RESPONDING").resumable
    assert not node("IDLE+DRAIN+POWERED_DOWN").resumable
    assert not node("IDLE").resumable


def test_providers_and_backends_that_do_not_go_together_are_refused() -> None:
    check_slurm_providers({"slurm": "node4"}, "slurm")
    check_slurm_providers({"command": "burst-1"}, "docker")
    with pytest.raises(ValueError, match="node node4's provider: 'command'; elastic nodes of "
                       "the slurm backend use provider \"slurm\""):
        check_slurm_providers({"command": "node4"}, "slurm")
    with pytest.raises(ValueError, match="needs c.GPUSpawner.backend = \"slurm\""):
        check_slurm_providers({"slurm": "burst-1"}, "docker")
