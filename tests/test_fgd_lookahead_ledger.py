"""``fgd-lookahead`` on the ledger (gpuspawner.placement.lookahead): FGD's score first, then,
among the near-best buckets, the one after which the likely next requests fit with the least
fragmentation growth; the per-type heaps it keeps across decisions agree with a full scan."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import pytest

from gpuspawner.placement import Bundle, Ledger, Owner, PlacementRefused
from gpuspawner.placement import lookahead as la
from gpuspawner.placement.workload import PodType
from tests.factories import GiB, make_node

#: shares of 300 and 500 milli-GPU (1 core each, as the bundles below), and a whole V100,
#: which no node here has
SHARES = [(PodType(1000, 300, 1), 0.45), (PodType(1000, 500, 1), 0.45)]
WORKLOAD = [*SHARES, (PodType(1000, 1000, 1, "V100"), 0.1)]


def ledger(policy: str, workload=WORKLOAD) -> Ledger:
    # a: two shareable GPUs, one with 200 milli free after an 800 share; b: one GPU with 500
    # free after a 500 share
    led = Ledger([make_node("a", gpus=2, shareable=True), make_node("b", gpus=1, numa=1,
                                                                     shareable=True)],
                 policy, workload=workload)
    led.reserve(Bundle(cores=1, gpu_milli=800), Owner("x", "1"), nodes=["a"])
    led.reserve(Bundle(cores=1, gpu_milli=500), Owner("x", "2"), nodes=["b"])
    return led


def test_an_exact_fit_keeps_a_whole_gpu_for_the_next_requests() -> None:
    # A 500 share: on a it takes the free GPU (a: [200, 500] left), on b the 500 left there
    # (b: [0]). The shares' F grows by 0 either way, the V100's (every idle milli-GPU counts
    # for it, as no node has one) falls by 500 x 0.1 either way: the same FGD score, a tie
    # fgd gives to a, the smaller name. The look-ahead asks what the next request costs (the
    # V100 fits nowhere either way). After a: a 300 share grows F by
    # 200 wherever it goes (it cuts a 500 down to 200 on a or on b); a 500 share by 0 (a's
    # 500). After b: a 300 share takes a's whole GPU (1000 -> 700, growth 0), a 500 share too
    # (growth 0). Expected 100 against 0: fgd-lookahead fills b exactly.
    got = {}
    for policy in ("fgd", "fgd-lookahead"):
        led = ledger(policy)
        got[policy] = led.reserve(Bundle(cores=1, gpu_milli=500), Owner("y")).node
    assert got == {"fgd": "a", "fgd-lookahead": "b"}
    # Then three 300 shares: after fgd the two 500 holes take one each and the third is
    # refused; after fgd-lookahead a's whole GPU takes all three (1000 -> 700 -> 400 -> 100).
    for policy, served in (("fgd", 2), ("fgd-lookahead", 3)):
        led = ledger(policy)
        led.reserve(Bundle(cores=1, gpu_milli=500), Owner("y"))
        ok = 0
        for i in range(3):
            try:
                led.reserve(Bundle(cores=1, gpu_milli=300), Owner("z", str(i)))
                ok += 1
            except PlacementRefused:
                pass
        assert ok == served, policy


@pytest.mark.parametrize("policy", ["fgd-lookahead", "fgd-mem-lookahead"])
def test_on_shares_alone_the_pick_is_fgds(policy: str) -> None:
    # The same case with the shares alone in the workload: no type asks for whole GPUs, so
    # the look-ahead stands aside and the 500 share goes where fgd puts it, a. On the
    # paper's gpushare100 trace (shares and CPU-only pods only) the look-ahead left more GPUs
    # idle than fgd (docs/placement.md "Share-only workloads").
    led = ledger(policy, workload=[(t, 0.5) for t, _p in SHARES])
    assert not led._c.frag.asks_whole_gpus()
    assert led.reserve(Bundle(cores=1, gpu_milli=500), Owner("y")).node == "a"


def test_without_a_difference_ahead_the_pick_is_fgds() -> None:
    # Whole GPUs only, two untouched nodes: the look-ahead sees the same on both and the
    # smaller name wins, as for fgd.
    for policy in ("fgd", "fgd-lookahead"):
        led = Ledger([make_node("b"), make_node("a")], policy,
                     workload=[(PodType(1000, 1000, 1), 1.0)])
        assert led.reserve(Bundle(cores=1, gpus=1), Owner("u")).node == "a", policy


def churn(led: Ledger, rng: random.Random, steps: int, shapes: Sequence[Bundle],
          p_release: float, after: Callable[[int], None] = lambda step: None) -> None:
    """``steps`` random steps on ``led``: release a random held allocation with probability
    ``p_release`` (when any is held), else book a random shape (a refusal is skipped);
    ``after(step)`` is called after each release or granted booking."""
    held: list[str] = []
    for step in range(steps):
        if held and rng.random() < p_release:
            led.release(held.pop(rng.randrange(len(held))))
        else:
            try:
                held.append(led.reserve(rng.choice(shapes), Owner("u", str(step))).id)
            except PlacementRefused:
                continue
        after(step)


def brute_best_two(c, nxt):
    out = []
    for du, cu, _p, _m, mu in nxt:
        gs = sorted((la._growth(c.frag, k[0], k[1], du, cu, c.frag.mem_left(k[2]), mu), k)
                    for k in c.buckets)
        gs = [(g, k) for g, k in gs if g != math.inf]
        if not gs:
            out.append((math.inf, None, math.inf))
        else:
            out.append((gs[0][0], gs[0][1], gs[1][0] if len(gs) > 1 else math.inf))
    return out


@pytest.mark.parametrize("policy", ["fgd-lookahead", "fgd-mem-lookahead"])
def test_kept_heaps_agree_with_a_full_scan_under_churn(policy: str) -> None:
    # Random bookings and releases on 30 nodes: after every step the best and second-best
    # growth per next type kept across decisions equal a scan of every bucket (the key of the
    # best may differ only where two buckets tie). The memory-aware policy's types ask memory
    # (given), so growths also depend on the buckets' memory class.
    rng = random.Random(7)
    nodes = [make_node(f"n{i:02d}", gpus=rng.choice((1, 2, 4, 8)), cores=rng.choice((8, 16, 32)),
                       shareable=True, memory_gib=rng.choice((16, 32, 64)))
             for i in range(30)]
    workload = [(PodType(1000, 1000, 1), 0.3), (PodType(2000, 500, 1), 0.3),
                (PodType(4000, 1000, 2), 0.2), (PodType(2000), 0.1), (PodType(1000, 250, 1), 0.1)]
    led = Ledger(nodes, policy, workload=workload)
    c = led._c
    if policy == "fgd-mem-lookahead":
        c.frag.set_workload(workload, memory={t: 1024 * (3 + 2 * i)
                                              for i, (t, _p) in enumerate(workload)})
    nxt = la.next_types(c.frag)
    assert any(mu for *_x, mu in nxt) == (policy == "fgd-mem-lookahead")
    shapes = [Bundle(cores=1, gpus=1, memory_bytes=4 * GiB), Bundle(cores=2, gpu_milli=500),
              Bundle(cores=4, gpus=2, memory_bytes=9 * GiB), Bundle(cores=2),
              Bundle(cores=1, gpu_milli=250, memory_bytes=2 * GiB)]
    checked = []

    def check(step: int) -> None:
        kept = la._best_two(c.lookahead, c.frag, c.buckets, c.created, nxt)
        brute = brute_best_two(c, nxt)
        assert [(b1, b2) for b1, _k, b2 in kept] == [(b1, b2) for b1, _k, b2 in brute], step
        checked.append(step)

    churn(led, rng, 400, shapes, 0.4, check)
    assert len(checked) > 300


def test_kept_heaps_follow_a_change_of_the_types_memory() -> None:
    # fgd-mem-lookahead under a static workload whose types' memory is learned: when the
    # memory changes (at a refresh point) but the workload does not, the per-type heaps
    # kept across decisions must be rebuilt, or they hold growths of the old memory.
    nodes = [make_node(f"n{i}", gpus=2, numa=1, cores=16, memory_gib=m, shareable=True)
             for i, m in enumerate((8, 16, 24, 48))]
    workload = [(PodType(1000, 1000, 1), 0.5), (PodType(1000, 500, 1), 0.5)]
    led = Ledger(nodes, "fgd-mem-lookahead", workload=workload)
    c = led._c
    led.reserve(Bundle(cores=1, gpu_milli=500), Owner("u", "0"))  # builds the kept state
    assert c.frag.memory == {}
    la._best_two(c.lookahead, c.frag, c.buckets, c.created, la.next_types(c.frag))
    for _ in range(16):  # the first refresh point: whole GPUs ask 20 GiB from now on
        led.observe(Bundle(cores=1, gpus=1, memory_bytes=20 * GiB))
    assert c.frag.memory[PodType(1000, 1000, 1)] == 20 * 1024
    nxt = la.next_types(c.frag)
    kept = la._best_two(c.lookahead, c.frag, c.buckets, c.created, nxt)
    assert [(b1, b2) for b1, _k, b2 in kept] == [(b1, b2) for b1, _k, b2 in
                                                 brute_best_two(c, nxt)]


def test_plain_fgd_keeps_no_log_of_new_buckets() -> None:
    # The log of created buckets feeds fgd-lookahead's heaps only: a hub on fgd books and
    # releases for months, and the log must not grow with every booking.
    rng = random.Random(3)
    led = Ledger([make_node(f"n{i}", gpus=4, shareable=True) for i in range(10)], "fgd",
                 workload=[(PodType(1000, 500, 1), 0.5), (PodType(1000, 1000, 1), 0.5)])
    steps = []
    churn(led, rng, 300, [Bundle(cores=1, gpu_milli=500)], 0.5, steps.append)
    assert len(steps) > 200  # bookings and releases happened
    assert led._c.created == [] and led._c.lookahead == {}


def test_the_log_stays_bounded_under_fgd_lookahead() -> None:
    rng = random.Random(4)
    led = Ledger([make_node(f"n{i}", gpus=4, shareable=True) for i in range(6)],
                 "fgd-lookahead",
                 workload=[(PodType(1000, 500, 1), 0.5), (PodType(1000, 1000, 1), 0.5)])
    most = [0]

    def measure(step: int) -> None:
        most[0] = max(most[0], len(led._c.created))

    churn(led, rng, 3000, [Bundle(cores=1, gpu_milli=250), Bundle(cores=1, gpu_milli=500)],
          0.5, measure)
    assert most[0] <= 4 * len(led._c.buckets) + 4096 + 1
