"""What a GPU share gives, in words (gpuspawner.gpushare.words), and where users read it: the
spawn form's profile cards (gpuspawner.hub.form.share_line) and the single-user server's
``GET /api/gpuspawner/gpus`` (``share``) that the JupyterLab GPU panel shows."""

from __future__ import annotations

import pytest

from gpuspawner.gpushare.words import fraction_words, share_text
from gpuspawner.hub.form import profile_cards, render_form
from gpuspawner.hub.profiles import load_profiles
from gpuspawner.placement import Ledger
from gpuspawner.singleuser.gpuviews.handlers import share_from_env

from .factories import GiB, make_node


def test_fractions_and_articles():
    assert [fraction_words(m) for m in (250, 500, 333, 150)] == ["1/4", "1/2", "1/3", "0.15"]
    with pytest.raises(ValueError, match="1..999"):
        fraction_words(1000)
    assert share_text(250, [20 * GiB], "A100 80 GB", ["dmem"]) == (
        "1/4 of an A100 80 GB: 20 GiB of GPU memory, compute time shared; held by the kernel "
        "(a GPU memory limit per server, cgroup dmem)")
    assert share_text(500, [8 * GiB], "T4").startswith("1/2 of a T4: 8 GiB of GPU memory")
    assert share_text(500, [], "").startswith("1/2 of a GPU: its share of the GPU memory")


def test_mps_gives_a_share_of_the_sms_and_mixed_nodes_are_named():
    assert share_text(250, [10 * GiB, 20 * GiB], "A100", ["mps"]) == (
        "1/4 of an A100: 10/20 GiB of GPU memory, 25 % of its SMs; held by NVIDIA MPS (a GPU "
        "memory limit and a share of the GPU's SMs per server)")
    text = share_text(250, [20 * GiB], "H100", {"n1": "dmem", "n2": "watchdog", "n3": "dmem"})
    assert "compute time shared" in text
    assert "; on n1, n3: held by the kernel" in text
    assert "; on n2: watched: over its GPU memory for long, a notebook is warned" in text


PROFILES = [
    {"slug": "share", "display_name": "Shared A100", "cpu": 1, "memory": "4G", "gpus": 0.25,
     "gpu_models": ["A100"]},
    {"slug": "whole", "display_name": "A100", "cpu": 1, "memory": "4G", "gpus": 1},
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "1G"},
]


def test_the_form_card_of_a_share_says_what_it_gives_and_what_holds_it_on_its_nodes():
    nodes = [make_node("n1", gpus=2, cores=16, memory_gib=256, shareable=True),
             make_node("n2", gpus=2, cores=16, memory_gib=256, shareable=True)]
    ledger = Ledger(nodes)
    cards = {c["slug"]: c for c in profile_cards(load_profiles(PROFILES), ledger, "ann", (),
                                                 share_mechanisms={"n1": "dmem", "n2": "dmem"})}
    assert cards["share"]["share"] == (
        "1/4 of an A100 80 GB: 20 GiB of GPU memory, compute time shared; held by the kernel "
        "(a GPU memory limit per server, cgroup dmem)")
    assert cards["whole"]["share"] == "" and cards["cpu"]["share"] == ""
    html = render_form("profiles.html.j2", [], cards=list(cards.values()), spawner=None,
                       selected="", quota_text="")
    assert 'data-testid="share">1/4 of an A100 80 GB: 20 GiB of GPU memory' in html
    # the share's radio is described by it (screen readers read it with the card)
    assert 'aria-describedby="gpus-1-bundle gpus-1-share gpus-1-status"' in html


def test_the_lab_panel_reads_the_share_its_server_started_with():
    env = {"GPUSPAWNER_GPU_MEMORY_LIMIT": str(20 * GiB), "GPUSPAWNER_GPU_MEMORY_FRACTION": "0.250",
           "GPUSPAWNER_GPU_SHARE_MECHANISM": "watchdog"}
    share = share_from_env(env, "NVIDIA A100-SXM4-80GB")
    assert share == {
        "milli": 250, "memory_limit_bytes": 20 * GiB, "mechanism": "watchdog",
        "text": "1/4 of an NVIDIA A100-SXM4-80GB: 20 GiB of GPU memory, compute time shared; "
                "watched: over its GPU memory for long, a notebook is warned and then its "
                "kernel is interrupted"}
    # a whole GPU (only the mechanism is set) or no GPU: nothing to say; malformed: nothing
    assert share_from_env({"GPUSPAWNER_GPU_SHARE_MECHANISM": "dmem"}, "A100") is None
    assert share_from_env({}, "") is None
    assert share_from_env({**env, "GPUSPAWNER_GPU_MEMORY_FRACTION": "lots"}, "A100") is None
