"""One hub user's shares per GPU on nodes whose shares run under gpuspawner's MPS control
daemons (``gpu_share: mps-daemon``; docs/gpu-sharing.md, MPS): the placement keeps another
user's share off a GPU that holds shares of someone else, in the choice of the GPU and of the
node, so the share goes to another GPU or node, or waits in the queue, instead of being
refused when its server starts. Pure: hand-made nodes, no hub."""

from __future__ import annotations

import pytest

from gpuspawner.placement import Allocation, Bundle, Ledger, Owner, PlacementRefused
from gpuspawner.placement.devices import share_blocked
from gpuspawner.placement.policies import POLICIES
from gpuspawner.placement.queue import WaitQueue
from tests.factories import GiB, make_node

QUARTER = Bundle(cores=1, memory_bytes=GiB, gpu_milli=250)
WHOLE = Bundle(cores=1, memory_bytes=GiB, gpus=1)


def ledger_of(*nodes, policy: str = "first-fit", mps: tuple[str, ...] | None = None) -> Ledger:
    """A ledger of ``nodes``; ``mps``: the nodes marked one user per GPU (default: all)."""
    ledger = Ledger(nodes, policy=policy)
    ledger.set_one_user_shares(mps if mps is not None else [n.name for n in nodes])
    return ledger


def gpu_of(a: Allocation) -> str:
    (g,) = a.gpus
    return g.uuid


def test_another_users_share_goes_to_another_gpu_of_the_node_and_the_same_users_joins():
    ledger = ledger_of(make_node("n1", gpus=2, numa=1, shareable=True))
    ann = ledger.reserve(QUARTER, Owner("ann", "a"))
    bob = ledger.reserve(QUARTER, Owner("bob", "b"))
    assert (ann.node, bob.node) == ("n1", "n1")
    assert gpu_of(ann) != gpu_of(bob)
    # ann's second server joins her GPU (best fit packs shares), not bob's
    assert gpu_of(ledger.reserve(QUARTER, Owner("ann", "a2"))) == gpu_of(ann)
    assert gpu_of(ledger.reserve(QUARTER, Owner("bob", "b2"))) == gpu_of(bob)


def test_without_the_mark_shares_pack_as_before():
    """The same requests on an unmarked node: bob's share joins ann's GPU (best fit), as the
    placement did before the rule (and still does under dmem, mps and the watchdog)."""
    ledger = ledger_of(make_node("n1", gpus=2, numa=1, shareable=True), mps=())
    ann = ledger.reserve(QUARTER, Owner("ann", "a"))
    assert gpu_of(ledger.reserve(QUARTER, Owner("bob", "b"))) == gpu_of(ann)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_node_whose_only_room_is_another_users_gpu_does_not_fit(policy):
    """n1 has one shareable GPU, holding ann's share with 750 milli-GPU free; every policy
    sends bob's share to n2, and ann's second to her GPU on n1 where one fits. Without the
    mark every policy but ``spread`` (and ``random``, by chance) puts bob's on n1: first in
    order, the fullest, the packing scores' choice."""
    nodes = (make_node("n1", gpus=1, numa=1, shareable=True),
             make_node("n2", gpus=1, numa=1, shareable=True))
    if policy not in ("spread", "random"):
        before = ledger_of(*nodes, policy=policy, mps=())
        before.reserve(QUARTER, Owner("ann", "a"), nodes=["n1"])
        assert before.reserve(QUARTER, Owner("bob", "b")).node == "n1"
    ledger = ledger_of(*nodes, policy=policy)
    ann = ledger.reserve(QUARTER, Owner("ann", "a"), nodes=["n1"])
    bob = ledger.reserve(QUARTER, Owner("bob", "b"))
    assert bob.node == "n2", policy
    assert ledger.fits_now(QUARTER, ["n1"], "bob") is None
    assert ledger.fits_now(QUARTER, ["n1"], "ann") == "n1"
    again = ledger.reserve(QUARTER, Owner("ann", "a2"), nodes=["n1"])
    assert gpu_of(again) == gpu_of(ann)


def test_when_no_gpu_is_free_for_the_user_the_share_is_refused_with_the_reason():
    ledger = ledger_of(make_node("n1", gpus=1, numa=1, shareable=True))
    ann = ledger.reserve(QUARTER, Owner("ann", "a"))
    with pytest.raises(PlacementRefused) as e:
        ledger.reserve(QUARTER, Owner("bob", "b"))
    assert e.value.reason == "gpu_share"
    assert f"{gpu_of(ann)} on n1" in str(e.value)
    assert "serve another user under MPS" in str(e.value)
    assert ledger.find("bob", "b") is None
    # whole GPUs and CPU-only bundles are no MPS clients: the rule does not touch them
    two = ledger_of(make_node("n1", gpus=2, numa=1, shareable=True))
    two.reserve(QUARTER, Owner("ann", "a"))
    assert two.reserve(WHOLE, Owner("bob", "w")).gpus[0].milli == 1000
    assert two.reserve(Bundle(cores=1, memory_bytes=GiB), Owner("bob", "cpu")).gpus == ()


def test_the_share_waits_in_the_queue_and_starts_when_the_gpu_is_free_again():
    ledger = ledger_of(make_node("n1", gpus=1, numa=1, shareable=True))
    ann = ledger.reserve(QUARTER, Owner("ann", "a"))
    q = WaitQueue(ledger)
    q.check_admissible(QUARTER, Owner("bob", "b"))  # it could fit: it may wait
    q.add(Owner("bob", "b"), QUARTER)
    assert q.schedule() == []
    # ann's second share arrives after bob's and starts on her GPU: bob's refusal on these
    # nodes is not taken for hers
    q.add(Owner("ann", "a2"), QUARTER)
    (out,) = q.schedule()
    assert out.entry.owner.user == "ann" and gpu_of(out.allocation) == gpu_of(ann)
    ledger.release(ann.id)
    assert q.schedule() == []  # ann's second share still holds the GPU
    ledger.release(out.allocation.id)
    (out,) = q.schedule()
    assert out.entry.owner.user == "bob" and gpu_of(out.allocation) == gpu_of(ann)


def test_the_rule_follows_bookings_releases_restores_and_the_mark():
    node = make_node("n1", gpus=1, numa=1, shareable=True)
    ledger = ledger_of(node)
    st = ledger._by_name["n1"]  # the node's state, as the device rules read it
    gpu = node.gpus[0].uuid
    a1 = ledger.reserve(QUARTER, Owner("ann", "a"))
    a2 = ledger.reserve(QUARTER, Owner("ann", "a2"))
    assert st.share_users == {gpu: {"ann": 2}}
    assert share_blocked(st, gpu, "bob") and not share_blocked(st, gpu, "ann")
    assert not share_blocked(st, gpu, None)
    ledger.release(a1.id)
    assert share_blocked(st, gpu, "bob")
    ledger.release(a2.id)
    assert st.share_users == {} and not share_blocked(st, gpu, "bob")
    # a restarted hub restores ann's running share: bob is kept off her GPU again
    fresh = ledger_of(node)
    fresh.restore([a1])
    with pytest.raises(PlacementRefused):
        fresh.reserve(QUARTER, Owner("bob", "b"))
    # unmarking the node lets the share in, and says so to the wait queue (grown)
    grown = fresh.grown
    fresh.set_one_user_shares([])
    assert fresh.grown > grown and fresh.one_user_share_nodes == frozenset()
    assert gpu_of(fresh.reserve(QUARTER, Owner("bob", "b"))) == gpu
    with pytest.raises(KeyError):
        fresh.set_one_user_shares(["nowhere"])
