"""What the one-user-per-GPU rule of ``mps-daemon`` nodes costs a share's placement decision
(:meth:`gpuspawner.placement.Ledger.set_one_user_shares`), beside the same ledger unmarked.

Two ledgers of the same nodes (8 shareable A100s each) and policy get the same requests: many
users' shares (250 or 500 milli-GPU, 4 cores, 16 GiB) until about ``--fill`` of the GPUs is
booked; one has every node marked (ours), the other none (the reference: shares pack across
users, as under dmem, mps or the watchdog). Then, on each, ``--probes`` decisions of a 250
milli-GPU share for a user who holds nothing (``reserve`` then ``release``, nothing kept),
and as many for a user who already holds shares: per decision, median and 99th percentile
in microseconds, side by side. Marked, a share of a new user is placed through a node filter
(the policy's per-shape caches are not used: :meth:`Ledger._choose`), which is where the cost
is. Also printed: how many GPUs hold shares of more than one user (0 when marked).

Run: ``taskset -c 1 .venv/bin/python benchmarks/mps_share_rule.py [--nodes 100] [--fill 0.6]
[--probes 300] [--policy fgd-mem-lookahead] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from gpuspawner.placement import Bundle, Ledger, Owner, PlacementRefused
from gpuspawner.placement.policies import DEFAULT_POLICY
from gpuspawner.testing.factories import GiB, make_node


def build(nodes: int, policy: str, marked: bool, fill: float, seed: int) -> Ledger:
    """The ledger after the fill requests (the same sequence for both sides)."""
    ledger = Ledger([make_node(f"n{i:03d}", gpus=8, numa=2, cores=64, memory_gib=512,
                               shareable=True) for i in range(nodes)], policy=policy, seed=seed)
    if marked:
        ledger.set_one_user_shares([f"n{i:03d}" for i in range(nodes)])
    rng = random.Random(seed)
    target = fill * nodes * 8 * 1000
    i = 0
    while ledger.gpu_milli_allocated() < target and i < nodes * 64:
        milli = rng.choice((250, 250, 500))
        user = f"u{rng.randrange(nodes * 4)}"
        try:
            ledger.reserve(Bundle(cores=4, memory_bytes=16 * GiB, gpu_milli=milli),
                           Owner(user, f"s{i}"), explain=False)
        except PlacementRefused:
            pass
        i += 1
    return ledger


def probe(ledger: Ledger, user: str, n: int) -> list[float]:
    """Microseconds of ``n`` share decisions of ``user`` (each released at once)."""
    out = []
    b = Bundle(cores=4, memory_bytes=16 * GiB, gpu_milli=250)
    for k in range(n):
        t = time.perf_counter()
        try:
            a = ledger.reserve(b, Owner(user, f"probe{k}"), explain=False, notify=False)
        except PlacementRefused:
            a = None
        out.append((time.perf_counter() - t) * 1e6)
        if a is not None:
            ledger.release(a.id, notify=False)
    return out


def mixed_gpus(ledger: Ledger) -> int:
    """GPUs holding shares of more than one user."""
    users: dict[str, set[str]] = {}
    for a in ledger.allocations():
        for g in a.gpus:
            if g.milli < 1000:
                users.setdefault(g.uuid, set()).add(a.owner.user)
    return sum(1 for u in users.values() if len(u) > 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--fill", type=float, default=0.6)
    ap.add_argument("--probes", type=int, default=300)
    ap.add_argument("--policy", default=DEFAULT_POLICY)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(f"{args.nodes} nodes x 8 shareable A100, policy {args.policy}, filled to "
          f"{args.fill:.0%}, {args.probes} decisions each (reserve + release), microseconds")
    print(f"{'ledger':<28}{'GPU booked':>11}{'mixed GPUs':>11}"
          f"{'new user p50':>14}{'p99':>9}{'holder p50':>12}{'p99':>9}")
    for name, marked in (("unmarked (reference)", False), ("mps-daemon marked (ours)", True)):
        ledger = build(args.nodes, args.policy, marked, args.fill, args.seed)
        holder = ledger.allocations()[0].owner.user
        probe(ledger, "warm", 20)
        new = probe(ledger, "newcomer", args.probes)
        old = probe(ledger, holder, args.probes)
        q = statistics.quantiles
        booked = ledger.gpu_milli_allocated() / (args.nodes * 8 * 1000)
        print(f"{name:<28}{booked:>11.1%}{mixed_gpus(ledger):>11}"
              f"{statistics.median(new):>14.0f}{q(new, n=100)[98]:>9.0f}"
              f"{statistics.median(old):>12.0f}{q(old, n=100)[98]:>9.0f}")


if __name__ == "__main__":
    main()
