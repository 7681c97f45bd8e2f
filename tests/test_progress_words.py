"""Spawn progress in user words (gpuspawner.hub.progress): the placement line and the refusal
with its link back to the form. Pure: ledger allocations on factory nodes."""

from __future__ import annotations

from gpuspawner.hub.progress import placement_message, refusal
from gpuspawner.placement import Bundle, Ledger, Owner

from .factories import GiB, make_node


def test_whole_gpu_on_a_numa_node():
    node = make_node("dgx", gpus=4, numa=2, cores=32, memory_gib=256)
    ledger = Ledger([node])
    alloc = ledger.reserve(Bundle(cores=8, memory_bytes=64 * GiB, gpus=1, gpu_models=("A100",)),
                           Owner("ann"))
    gpu = node.gpu(alloc.gpus[0].uuid)
    numa = alloc.mems[0]
    assert placement_message(alloc, node) == \
        f"1 x A100 80 GB (GPU {gpu.index}), 8 cores on NUMA node {numa}, 64 GiB memory"
    assert placement_message(alloc, node, show_node=True).endswith(" on node dgx")


def test_two_gpus_share_and_cpu_only():
    node = make_node("n", gpus=4, numa=1, cores=16, memory_gib=64, shareable=True,
                     model="T4")
    ledger = Ledger([node])
    two = ledger.reserve(Bundle(cores=2, memory_bytes=GiB, gpus=2, disk_bytes=10 * GiB),
                         Owner("a"))
    idx = sorted(node.gpu(u).index for u in two.gpu_uuids)
    # one NUMA node: not worth naming
    assert placement_message(two, node) == \
        f"2 x T4 80 GB (GPUs {idx[0]}, {idx[1]}), 2 cores, 1 GiB memory, 10 GiB disk"
    share = ledger.reserve(Bundle(cores=1, memory_bytes=GiB // 2, gpu_milli=250), Owner("b"))
    assert placement_message(share, node).startswith("¼ of a shared T4 80 GB (GPU ")
    cpu = ledger.reserve(Bundle(cores=1, memory_bytes=GiB), Owner("c"))
    assert placement_message(cpu, node) == "1 core, 1 GiB memory"
    assert placement_message(cpu) == f"1 core on NUMA node {cpu.mems[0]}, 1 GiB memory"


def test_refusal_links_back_with_the_profile():
    e = refusal(400, "profile 'a100': only 0 <A100> free", "/hub/spawn/ann/", "a100 x")
    assert e.status_code == 400 and e.log_message == "profile 'a100': only 0 <A100> free"
    assert not hasattr(e, "jupyterhub_message")  # the API's message stays the reason
    assert "&lt;A100&gt;" in e.jupyterhub_html_message
    assert 'href="/hub/spawn/ann/#profile=a100%20x"' in e.jupyterhub_html_message


def test_spawn_form_url():
    from types import SimpleNamespace

    from gpuspawner.hub.progress import ProgressEvents

    class S(ProgressEvents):
        pass

    s = S()
    s.hub = SimpleNamespace(base_url="/base/hub/")
    s.user = SimpleNamespace(name="a b", escaped_name="a%20b")
    s.name = "gpu 1"
    assert s.spawn_form_url() == "/base/hub/spawn/a%20b/gpu%201"
    e = s.refused(503, "node down", "cpu")
    assert e.status_code == 503 and 'href="/base/hub/spawn/a%20b/gpu%201#profile=cpu"' in \
        e.jupyterhub_html_message
    s.hub, s.user, s.name = None, SimpleNamespace(name="ann"), ""
    assert s.spawn_form_url() == "/hub/spawn/ann"
