"""The spawn form's cards (gpuspawner.hub.form): one line of resources, singular/plural, what
is green, what is hidden, the quota line, the waiting count and the preselected card. Pure: a
ledger of factory nodes and the Jinja2 template, no hub."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from gpuspawner.hub.form import (
    plural,
    profile_cards,
    quota_line,
    render_form,
    resources_line,
    size_text,
)
from gpuspawner.hub.profiles import load_profiles
from gpuspawner.placement import Bundle, Ledger, Owner, QuotaTable

from .factories import GiB, make_node

PROFILES = [
    {"slug": "cpu", "display_name": "Small", "cpu": 1, "memory": "1G", "default": True,
     "description": "For editing."},
    {"slug": "cpu-2", "display_name": "Medium", "cpu": 2, "memory": "2G"},
    {"slug": "share", "display_name": "Shared GPU", "cpu": 1, "memory": "4G", "gpus": 0.25},
    {"slug": "a100", "display_name": "A100", "cpu": 8, "memory": "64G", "gpus": 1,
     "gpu_models": ["A100"], "disk": "50G"},
    {"slug": "a100-2", "display_name": "Two A100", "cpu": 16, "memory": "128G", "gpus": 2,
     "gpu_models": ["A100"], "groups": ["gpu-users"]},
    {"slug": "huge", "display_name": "Huge", "cpu": 64, "memory": "8G"},
]


def cards_for(nodes, user="ann", groups=(), quotas=None):
    ledger = Ledger(nodes, quotas=quotas)
    return ledger, {c["slug"]: c for c in profile_cards(load_profiles(PROFILES), ledger, user,
                                                           groups)}


def test_words():
    assert plural(1, "core") == "1 core"
    assert plural(2, "core") == "2 cores"
    assert plural(0.5, "GPU") == "0.5 GPUs"
    assert size_text(64 * GiB) == "64 GiB"
    assert size_text(3 * GiB // 2) == "1.5 GiB"
    node = make_node(gpus=2, cores=16, memory_gib=256)
    assert resources_line(Bundle(cores=8, memory_bytes=64 * GiB, gpus=1, gpu_models=("A100",),
                                 disk_bytes=50 * GiB), [node]) == \
        "1 x A100 80 GB · 8 cores · 64 GiB memory · 50 GiB disk"
    assert resources_line(Bundle(cores=1, memory_bytes=GiB)) == "1 core · 1 GiB memory"
    assert resources_line(Bundle(cores=1, gpu_milli=250), []) == "¼ of a shared GPU · 1 core"
    assert resources_line(Bundle(cores=2, gpus=2), []) == "2 GPUs · 2 cores"


def test_hub_without_gpus_hides_what_cannot_start():
    ledger, cards = cards_for([make_node(gpus=0, cores=4, memory_gib=16)],
                              quotas=QuotaTable.from_config(default_user={"gpus": 2}))
    assert cards["cpu"]["available"] and cards["cpu"]["free"]
    assert cards["cpu"]["bundle"] == "1 core · 1 GiB memory"
    assert cards["cpu-2"]["bundle"] == "2 cores · 2 GiB memory"
    for slug, reason in (("share", "no GPU on this hub"), ("a100", "no A100 on this hub"),
                         ("a100-2", "no A100 on this hub"),
                         ("huge", "larger than any node of this hub")):
        assert cards[slug]["never"] and not cards[slug]["available"], slug
        assert cards[slug]["reason"] == reason
        assert not cards[slug]["free"] and cards[slug]["availability"] == ""
    # a GPU quota on a hub without GPUs: no quota line
    assert quota_line(ledger, "ann", []) == ""


def test_gpu_hub_green_only_with_free_capacity():
    nodes = [make_node("n1", gpus=2, cores=16, memory_gib=256, shareable=False)]
    ledger, cards = cards_for(nodes, groups=["gpu-users"],
                              quotas=QuotaTable.from_config(default_user={"gpus": 2}))
    assert cards["a100"]["free"] and cards["a100"]["availability"] == "2 of 2 A100 free now"
    assert cards["a100-2"]["free"]
    # no shareable GPU: the share can never start
    assert cards["share"]["never"] and cards["share"]["reason"] == "no shared GPU on this hub"
    assert quota_line(ledger, "ann", ["gpu-users"]) == "you use 0 of your 2 GPUs"
    ledger.reserve(Bundle(cores=1, gpus=1), Owner("bob"))
    cards = {c["slug"]: c for c in profile_cards(load_profiles(PROFILES), ledger, "ann",
                                                 ["gpu-users"])}
    assert cards["a100"]["free"]
    # a GPU profile waits in the queue by default: selectable, not green, says so
    a2 = cards["a100-2"]
    assert a2["available"] and a2["waits"] and not a2["free"] and not a2["never"]
    assert a2["reason"] == "all A100 busy now: you will wait in the queue"
    # with queue: false it cannot be picked now
    no_queue = [dict(p, queue=False) if p["slug"] == "a100-2" else p for p in PROFILES]
    a2 = {c["slug"]: c for c in profile_cards(load_profiles(no_queue), ledger, "ann",
                                              ["gpu-users"])}["a100-2"]
    assert not a2["available"] and not a2["waits"] and a2["reason"] == "only 1 A100 free now"


def test_group_and_quota_reasons_and_cpu_room():
    nodes = [make_node("n1", gpus=1, cores=4, memory_gib=16)]
    ledger, cards = cards_for(nodes, quotas=QuotaTable.from_config(default_user={"gpus": 0}))
    assert cards["a100-2"]["never"]  # 2 GPUs, a node with 1
    # 8 cores on a 4-core node
    assert cards["a100"]["never"] and cards["a100"]["reason"] == "larger than any node of " \
        "this hub"
    ledger.reserve(Bundle(cores=4, memory_bytes=GiB), Owner("bob"))
    cards = {c["slug"]: c for c in profile_cards(load_profiles(PROFILES), ledger, "ann", [])}
    assert not cards["cpu"]["available"] and cards["cpu"]["reason"] == "no room on the hub now"
    ledger2, cards2 = cards_for([make_node("n1", gpus=4, cores=64, memory_gib=512)],
                                quotas=QuotaTable.from_config(default_user={"gpus": 0}))
    assert cards2["a100"]["reason"] == "over your quota (GPUs)"
    assert cards2["a100-2"]["reason"] == "not available to your group"
    assert quota_line(ledger2, "ann", []) == "you use 0 of your 0 GPUs"
    assert quota_line(Ledger([make_node(gpus=1)]), "ann", []) == ""  # no quota


class _Inputs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.inputs: list[dict[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "input" and dict(attrs).get("type") == "radio":
            self.inputs.append(dict(attrs))


def _render(cards, selected="", quota_text=""):
    html = render_form("profiles.html.j2", [], cards=cards, selected=selected,
                       quota_text=quota_text, spawner=None)
    parser = _Inputs()
    parser.feed(html)
    return html, {i["value"]: i for i in parser.inputs}


@pytest.mark.parametrize("selected, checked", [("", "cpu"), ("cpu-2", "cpu-2"),
                                               ("a100", "cpu"), ("nope", "cpu")])
def test_template_checks_one_card(selected, checked):
    _, cards = cards_for([make_node(gpus=0, cores=4, memory_gib=16)])
    html, inputs = _render([c for c in cards.values() if not c["never"]], selected)
    assert [v for v, i in inputs.items() if "checked" in i] == [checked]
    assert set(inputs) == {"cpu", "cpu-2"}  # hidden: the ones that cannot start here
    assert "1 cores" not in html and "1 core · 1 GiB memory" in html
    assert html.count("1 core · 1 GiB memory") == 1
    assert "waiting" not in html


def test_template_unavailable_cards_say_why_and_queue_count():
    _, cards = cards_for([make_node(gpus=0, cores=4, memory_gib=16)])
    every = list(cards.values())
    every[1]["queued"] = 3
    html, inputs = _render(every, quota_text="you use 0 of your 2 GPUs")
    assert "disabled" in inputs["a100"] and "disabled" not in inputs["cpu"]
    assert re.search(r"Unavailable: no A100 on this hub", html)
    assert '<span class="gpus-status gpus-queued" data-testid="queued">3 waiting</span>' in html
    assert 'data-testid="quota">you use 0 of your 2 GPUs<' in html
    assert 'name="fail_now"' in html  # a queueing (GPU) profile is offered: "Do not wait"
    # every radio is described by its resources line and its status
    for i in inputs.values():
        for ref in i["aria-describedby"].split():
            assert f'id="{ref}"' in html


class _FakeCluster:
    def __init__(self, ledger):
        self.ledger = ledger
        self.queue = None

    async def ensure_restored(self, owner_exists):
        return None


def _form_spawner(ledger, **config):
    from types import SimpleNamespace

    from gpuspawner.hub.form import OptionsFormMixin

    class Spawner(OptionsFormMixin):
        options_form = ""
        profiles = PROFILES
        quotas: dict = {}
        user = SimpleNamespace(name="ann", groups=[])
        user_options: dict = {}
        cluster = _FakeCluster(ledger)

        def _owner_exists(self, user, server):
            return True

    return Spawner(**config)


@pytest.mark.parametrize("show", [False, True])
async def test_options_form_hides_or_shows_what_cannot_start(show):
    ledger = Ledger([make_node(gpus=0, cores=4, memory_gib=16)])
    sp = _form_spawner(ledger, show_unavailable_profiles=show)
    sp.user_options = {"profile": "cpu-2"}
    html = await sp.get_options_form()
    assert ('data-profile="a100"' in html) is show
    assert ("Unavailable: no A100 on this hub" in html) is show
    assert re.search(r'value="cpu-2" checked', html)


def test_form_data_do_not_wait_becomes_queue_false():
    from gpuspawner.hub.form import OptionsFormMixin

    from_form = OptionsFormMixin._default_options_from_form(None)
    assert from_form({"profile": ["a100"]}) == {"profile": "a100"}
    assert from_form({"profile": ["a100"], "fail_now": ["on"]}) == {
        "profile": "a100", "queue": False}


async def test_the_form_offers_a_profiles_images_and_reads_the_choice_back():
    """A profile with ``profile_options.image`` shows its choices and, where enabled, the
    field for an image of one's own (KubeSpawner's field names); the form data become the
    ``image`` / ``image--unlisted-choice`` keys of the chosen profile only."""
    from gpuspawner.hub.form import OptionsFormMixin

    option = {"choices": {"pt": {"display_name": "PyTorch", "image": "r.io/pt:1"},
                          "tf": {"display_name": "TF", "image": "r.io/tf:1", "default": True}},
              "unlisted_choice": {"enabled": True, "display_name": "Your image",
                                  "validation_message": "an image of r.io"}}
    ledger = Ledger([make_node(gpus=0, cores=4, memory_gib=16)])
    sp = _form_spawner(ledger)
    sp.profiles = [
        {"slug": "own", "cpu": 1, "memory": "1G", "profile_options": {"image": option}},
        {"slug": "cpu", "cpu": 1, "memory": "1G", "default": True}]
    html = await sp.get_options_form()
    assert re.search(r'<select name="profile-option-own--image"', html)
    assert re.search(r'<option value="tf" selected>TF</option>', html)
    assert '<option value="--unlisted-choice">Your image</option>' in html
    assert re.search(r'name="profile-option-own--image--unlisted-choice"[^>]*'
                     r'title="an image of r.io"', html)
    assert "profile-option-cpu--" not in html  # a profile without choices shows none

    from_form = OptionsFormMixin._default_options_from_form(None)
    assert from_form({"profile": ["own"], "profile-option-own--image": ["pt"]}) == {
        "profile": "own", "image": "pt"}
    assert from_form({"profile": ["own"], "profile-option-own--image": ["--unlisted-choice"],
                      "profile-option-own--image--unlisted-choice": [" r.io/mine:2 "]}) == {
        "profile": "own", "image--unlisted-choice": "r.io/mine:2"}
    # another card's fields are not this spawn's
    assert from_form({"profile": ["cpu"], "profile-option-own--image": ["pt"]}) == {
        "profile": "cpu"}
