"""The fair wait queue (gpuspawner.placement.queue): admission, DRF order, bounded backfill
with a reservation for the head, persistence. Pure: a Ledger over factory nodes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.placement import Bundle, Ledger, Owner, PlacementRefused, QuotaExceeded
from gpuspawner.placement.queue import WaitQueue
from gpuspawner.placement.quota import QuotaTable
from tests.factories import GiB, make_node


def gpus(n: int, cores: int = 1) -> Bundle:
    return Bundle(cores=cores, gpus=n, memory_bytes=GiB, numa_policy="none")


def one_node(n_gpus: int = 4, **kw) -> Ledger:
    return Ledger([make_node("n1", gpus=n_gpus, **kw)], policy="first-fit")


def started(outcomes) -> list[str]:
    return [o.entry.owner.user for o in outcomes if o.allocation is not None]


# -- admission ------------------------------------------------------------------------------
def test_what_can_never_fit_is_refused_before_queueing():
    ledger = Ledger([make_node("n1", gpus=2), make_node("n2", gpus=2)])
    q = WaitQueue(ledger)
    q.check_admissible(gpus(2), Owner("a"))  # fits an empty node: may wait
    with pytest.raises(PlacementRefused) as e:
        q.check_admissible(gpus(3), Owner("a"))  # no node has 3 GPUs
    assert "could ever hold" in str(e.value) and e.value.reason in ("never", "too_large")
    with pytest.raises(PlacementRefused) as e:
        q.check_admissible(Bundle(cores=1, gpus=1, gpu_models=("H100",)), Owner("a"))
    assert e.value.reason == "no_gpu_model"
    ledger.set_node_state("n2", "down", "slurmd not responding")
    ledger.drain_gpu("GPU-n1-00", "xid 79")
    with pytest.raises(PlacementRefused) as e:  # 2 GPUs fit only n2 (down) or n1 (one drained)
        q.check_admissible(gpus(2), Owner("a"))
    assert "node n2 is down" in str(e.value)
    q.check_admissible(gpus(1), Owner("a"))


def test_over_quota_is_refused_before_queueing():
    ledger = Ledger([make_node(gpus=4)], quotas=QuotaTable.from_config(
        default_user={"gpus": 2}))
    ledger.reserve(gpus(2), Owner("a", "one"))
    with pytest.raises(QuotaExceeded):
        WaitQueue(ledger).check_admissible(gpus(1), Owner("a", "two"))


# -- order --------------------------------------------------------------------------------
def test_a_user_holding_gpus_does_not_jump_ahead_of_one_holding_none():
    ledger = one_node(4)
    ledger.reserve(gpus(3), Owner("rich", "held"))
    ledger.reserve(gpus(1), Owner("other", "held"))  # all 4 taken
    q = WaitQueue(ledger)
    first = q.add(Owner("rich", "more"), gpus(1))  # arrives first, but holds 3
    second = q.add(Owner("poor"), gpus(1))  # holds nothing
    assert [e.owner.user for e in q.order()] == ["poor", "rich"]
    assert q.position(second.id) == (1, 2) and q.position(first.id) == (2, 2)
    ledger.release(ledger.find("other", "held").id)
    assert started(q.schedule()) == ["poor"]
    assert q.position(first.id) == (1, 1)


def test_a_higher_priority_starts_first_and_fairness_orders_within_one():
    """Interactive servers before jobs (c.GPUJobs.queue_priority = -1): the job that came
    first and whose user holds nothing still waits behind every server; among the servers,
    DRF (the rich user after the poor one), and the priority survives the queue file."""
    ledger = one_node(4)
    ledger.reserve(gpus(3), Owner("rich", "held"))
    ledger.reserve(gpus(1), Owner("other", "held"))  # all 4 taken
    q = WaitQueue(ledger)
    job = q.add(Owner("jobber", "job/1"), gpus(1), priority=-1)
    rich = q.add(Owner("rich", "more"), gpus(1))
    poor = q.add(Owner("poor"), gpus(1))
    assert [e.id for e in q.order()] == [poor.id, rich.id, job.id]
    assert q.position(job.id) == (3, 3)
    # the same entries at one priority: fair order puts the job (holds nothing, first) first
    flat = WaitQueue(one_node(4))
    for e in (job, rich, poor):
        flat.add(e.owner, e.bundle)
    assert [e.owner.user for e in flat.order()][0] == "jobber"
    # kept across a restart (the queue file) and re-set when a spawn claims its entry
    again = WaitQueue(ledger)
    again.restore(json.loads(json.dumps(q.to_list())))
    assert [e.owner.user for e in again.order()] == ["poor", "rich", "jobber"]
    claimed = again.add(Owner("jobber", "job/1"), gpus(1), priority=5)
    assert claimed.priority == 5 and again.order()[0].owner.user == "jobber"
    ledger.release(ledger.find("other", "held").id)
    assert started(q.schedule()) == ["poor"]


def test_fifo_within_a_user_and_between_equal_users():
    ledger = one_node(2)
    ledger.reserve(gpus(2), Owner("x"))
    q = WaitQueue(ledger)
    a1 = q.add(Owner("a", "1"), gpus(1))
    q.add(Owner("b", "1"), gpus(1))
    a2 = q.add(Owner("a", "2"), gpus(1))
    order = [(e.owner.user, e.owner.server) for e in q.order()]
    # a's second entry counts a's first as held (DRF projection): b comes between
    assert order == [("a", "1"), ("b", "1"), ("a", "2")]
    assert q.position(a1.id)[0] < q.position(a2.id)[0]


def test_group_weights_scale_the_share():
    ledger = one_node(4)
    ledger.reserve(gpus(1), Owner("heavy", "h", ("lab",)))
    ledger.reserve(gpus(1), Owner("light", "h"))
    ledger.reserve(gpus(2), Owner("x"))
    q = WaitQueue(ledger, group_weights={"lab": 4.0})
    q.add(Owner("light", "s"), gpus(1))
    q.add(Owner("heavy", "s", ("lab",)), gpus(1))
    # both hold 1 of 4 GPUs, but lab's weight 4 makes heavy's weighted share smaller
    assert [e.owner.user for e in q.order()] == ["heavy", "light"]
    with pytest.raises(ValueError, match="group_weights.lab"):
        WaitQueue(ledger, group_weights={"lab": 0})


# -- backfill with a reservation for the head -----------------------------------------------
def test_large_bundle_at_the_head_starts_within_its_bound_while_small_ones_keep_arriving():
    ledger = one_node(4)
    holders = [ledger.reserve(gpus(1), Owner(f"h{i}")) for i in range(4)]
    q = WaitQueue(ledger, max_bypass=2)
    big = q.add(Owner("big"), gpus(4))
    ledger.release(holders[0].id)
    small_started = 0
    released = 1
    for i in range(20):  # small ones keep arriving, holders keep leaving
        q.add(Owner(f"s{i}"), gpus(1))
        out = q.schedule()
        small_started += sum(1 for o in out if o.entry.owner.user.startswith("s"))
        if any(o.entry is big for o in out):
            break
        if released < 4:
            ledger.release(holders[released].id)
            released += 1
        else:  # the small ones that started stop again, one per round
            running = [a for a in ledger.allocations() if a.owner.user.startswith("s")]
            if running:
                ledger.release(running[0].id)
    else:
        pytest.fail("the large bundle never started")
    assert big.bypassed == 2 and small_started == 2  # passed exactly max_bypass times
    assert ledger.find("big") is not None


def test_without_a_bound_the_head_would_starve():
    # the same arrival pattern with an unbounded bypass: big never starts in 20 rounds
    ledger = one_node(4)
    holders = [ledger.reserve(gpus(1), Owner(f"h{i}")) for i in range(4)]
    q = WaitQueue(ledger, max_bypass=10**6)
    big = q.add(Owner("big"), gpus(4))
    for i in range(20):
        if i < 4:
            ledger.release(holders[i].id)
        else:
            running = [a for a in ledger.allocations() if a.owner.user.startswith("s")]
            ledger.release(running[0].id)
        q.add(Owner(f"s{i}"), gpus(1))
        assert all(o.entry is not big for o in q.schedule())
    assert q.get(big.id) is not None


def test_past_its_bound_the_head_keeps_one_node_and_the_others_stay_open():
    # two 4-GPU nodes, both busy; a 4-GPU head waits. Once passed max_bypass times only the
    # node that lacks the least (n2: 1 GPU short, n1: 2) is kept for it: small ones go on
    # starting on n1 (with every node that could take the head reserved, as before, they
    # waited behind it and n1's free GPUs stayed idle)
    ledger = Ledger([make_node("n1", gpus=4), make_node("n2", gpus=4)], policy="first-fit")
    on1 = [ledger.reserve(gpus(1), Owner(f"a{i}"), nodes=["n1"]) for i in range(4)]
    on2 = [ledger.reserve(gpus(1), Owner(f"b{i}"), nodes=["n2"]) for i in range(4)]
    q = WaitQueue(ledger, max_bypass=0)
    big = q.add(Owner("big"), gpus(4))
    for a in on1[:2] + on2[:3]:
        ledger.release(a.id)
    assert ledger.closest_node(gpus(4), {"n1", "n2"}) == "n2"
    for i in range(3):
        q.add(Owner(f"s{i}"), gpus(1))
    assert started(q.schedule()) == ["s0", "s1"]  # n1's two free GPUs; n2 is kept
    assert {ledger.find(f"s{i}").node for i in range(2)} == {"n1"} and big.bypassed == 0
    assert [e.owner.user for e in q.order()] == ["big", "s2"]
    ledger.release(on2[3].id)  # n2 is empty now: the head starts there, before s2
    assert started(q.schedule()) == ["big"] and ledger.find("big").node == "n2"


def test_closest_node_counts_whole_gpus_shares_cores_and_memory():
    ledger = Ledger([make_node("n1", gpus=2, cores=8), make_node("n2", gpus=2, cores=8)],
                    policy="first-fit")
    ledger.reserve(gpus(1, cores=6), Owner("x"), nodes=["n1"])
    ledger.reserve(gpus(2, cores=1), Owner("y"), nodes=["n2"])
    assert ledger.closest_node(gpus(2), ["n1", "n2"]) == "n1"  # 1 GPU short vs 2
    assert ledger.closest_node(Bundle(cores=4, numa_policy="none"), ["n1", "n2"]) == "n2"
    assert ledger.closest_node(gpus(1), ["n2", "n1"]) == "n1"
    assert ledger.closest_node(gpus(1), []) is None
    shared = Ledger([make_node("s1", gpus=1, shareable=True),
                     make_node("s2", gpus=1, shareable=True)], policy="first-fit")
    share = Bundle(cores=1, gpu_milli=600, numa_policy="none")
    shared.reserve(Bundle(cores=1, gpu_milli=500, numa_policy="none"), Owner("x"), nodes=["s1"])
    shared.reserve(Bundle(cores=1, gpu_milli=300, numa_policy="none"), Owner("y"), nodes=["s2"])
    assert shared.closest_node(share, ["s1", "s2"]) == "s2"  # 700 free there, 500 on s1


def test_backfill_on_a_node_the_head_cannot_use_is_not_a_bypass():
    ledger = Ledger([make_node("gpu", gpus=2), make_node("cpu", gpus=0)], policy="first-fit")
    ledger.reserve(gpus(1), Owner("x"))
    q = WaitQueue(ledger, max_bypass=0)  # strict: no bypass on the head's nodes
    head = q.add(Owner("big"), gpus(2))
    q.add(Owner("cpu-user"), Bundle(cores=1, memory_bytes=GiB, numa_policy="none"))
    q.add(Owner("gpu-user"), gpus(1))
    out = q.schedule()
    assert started(out) == ["cpu-user"]  # only on the node the head can never use
    assert ledger.find("cpu-user").node == "cpu" and head.bypassed == 0
    assert [e.owner.user for e in q.order()] == ["big", "gpu-user"]


def test_quota_reached_while_waiting_fails_the_entry_and_frees_its_place():
    ledger = Ledger([make_node(gpus=2)], quotas=QuotaTable.from_config(
        default_user={"gpus": 2}), policy="first-fit")
    ledger.reserve(gpus(2), Owner("x"))
    q = WaitQueue(ledger)
    q.add(Owner("a", "1"), gpus(1))
    q.add(Owner("a", "2"), gpus(2))
    ledger.release(ledger.find("x").id)
    out = q.schedule()
    assert [(o.entry.owner.server, o.allocation is not None) for o in out] == [
        ("1", True), ("2", False)]
    assert isinstance(out[1].error, QuotaExceeded) and len(q) == 0


# -- persistence ----------------------------------------------------------------------------
def test_restored_entries_keep_their_order_and_wait_to_be_claimed():
    ledger = one_node(1)
    ledger.reserve(gpus(1), Owner("x"))
    t = [1000.0]
    q = WaitQueue(ledger, clock=lambda: t[0])
    for u in ("a", "b", "c"):
        q.add(Owner(u), gpus(1), profile="gpu", options={"profile": "gpu"})
        t[0] += 1
    saved = json.loads(json.dumps(q.to_list()))

    q2 = WaitQueue(ledger, clock=lambda: t[0])
    assert q2.restore(saved + [{"user": "broken"}]) == ["queue[3]: 'id'"]
    assert [e.owner.user for e in q2.order()] == ["a", "b", "c"]
    late = q2.add(Owner("d"), gpus(1))  # a new spawn comes after the restored ones
    b = q2.add(Owner("b"), gpus(1))  # b's spawn claims its old place
    assert b.enqueued == 1001.0 and q2.position(b.id) == (2, 4)
    ledger.release(ledger.find("x").id)
    assert q2.schedule() == []  # a heads the queue, unclaimed: nobody passes it
    t[0] += 120
    gone = q2.expire_unclaimed(60)
    assert [e.owner.user for e in gone] == ["a", "c"]
    assert started(q2.schedule()) == ["b"] and q2.position(late.id) == (1, 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "release", "cancel"]),
                          st.integers(0, 5), st.integers(1, 3)), max_size=40))
def test_queue_never_over_allocates_and_every_grant_fits(ops):
    ledger = Ledger([make_node("n1", gpus=4), make_node("n2", gpus=2)], policy="fgd")
    q = WaitQueue(ledger, max_bypass=1)
    for i, (op, user, n) in enumerate(ops):
        if op == "add":
            if q.find(f"u{user}", str(i)) is None:
                q.add(Owner(f"u{user}", str(i)), gpus(n))
        elif op == "release" and ledger.allocations():
            ledger.release(ledger.allocations()[user % len(ledger.allocations())].id)
        elif op == "cancel" and len(q):
            q.remove(q.order()[user % len(q)].id)
        for o in q.schedule():
            assert o.allocation is not None and len(o.allocation.gpus) == o.entry.bundle.gpus
        used = [g.uuid for a in ledger.allocations() for g in a.gpus]
        assert len(used) == len(set(used)) <= 6
        # nothing that fits now waits behind nothing: if the queue's head fits, it started
        order = q.order()
        if order:
            assert ledger.nodes_that_could_take(order[0].bundle)


# -- tries the ledger would refuse again are not made ---------------------------------------
def counting(ledger: Ledger) -> list[int]:
    """Count the ledger's reserve calls (an instance attribute wrapping the method)."""
    calls = [0]
    real = ledger.reserve

    def reserve(*args, **kw):
        calls[0] += 1
        return real(*args, **kw)

    ledger.reserve = reserve  # type: ignore[method-assign]
    return calls


def test_a_refused_try_is_not_made_again_until_something_grows():
    ledger = Ledger([make_node("n1", gpus=2)], policy="first-fit")
    held = ledger.reserve(gpus(2), Owner("x"))
    q = WaitQueue(ledger)
    q.add(Owner("a"), gpus(1))
    q.add(Owner("b"), gpus(1))
    calls = counting(ledger)
    assert q.schedule() == [] and calls[0] == 1  # b's try is a's: same bundle, same nodes
    grown = ledger.grown
    ledger.reserve(Bundle(cores=1, memory_bytes=GiB), Owner("cpu"))  # a booking: no growth
    ledger.drain_gpu("GPU-n1-00", "xid 79")  # a drain: no growth
    assert ledger.grown == grown
    calls[0] = 0
    assert q.schedule() == [] and calls[0] == 0
    ledger.release(held.id)
    assert ledger.grown > grown
    assert started(q.schedule()) == ["a"]  # GPU 00 is drained: one GPU for a, b waits
    ledger.undrain_gpu("GPU-n1-00")
    assert started(q.schedule()) == ["b"]


def test_a_skipped_try_still_fails_on_a_quota_reached_meanwhile():
    # the ledger checks quotas before placing: a try skipped because nothing grew must
    # still end the entry when the user's quota no longer allows it
    ledger = Ledger([make_node("n1", gpus=2), make_node("n2", gpus=2)], policy="first-fit",
                    quotas=QuotaTable.from_config(default_user={"gpus": 2}))
    ledger.reserve(gpus(2), Owner("x"), nodes=["n1"])
    q = WaitQueue(ledger)
    e = q.add(Owner("a", "1"), gpus(2), nodes=["n1"])
    assert q.schedule() == []
    ledger.reserve(gpus(1), Owner("a", "2"), nodes=["n2"])  # a booking: nothing grew
    out = q.schedule()
    assert [o.entry.id for o in out] == [e.id] and isinstance(out[0].error, QuotaExceeded)
    assert len(q) == 0


def test_ledger_capacity_follows_drains_node_states_and_new_nodes():
    ledger = Ledger([make_node("n1", gpus=2, cores=8)])
    assert (ledger.capacity().gpu_milli, ledger.capacity().cores) == (2000, 8)
    ledger.drain_gpu("GPU-n1-00", "ecc")
    assert ledger.capacity().gpu_milli == 1000
    grown = ledger.grown
    ledger.add_node(make_node("n2", gpus=4, cores=8))
    assert ledger.capacity().gpu_milli == 5000 and ledger.grown > grown
    ledger.set_node_state("n2", "down", "gone")
    assert ledger.capacity().gpu_milli == 1000
    grown = ledger.grown
    ledger.set_node_state("n2", "up")
    assert ledger.capacity().gpu_milli == 5000 and ledger.grown > grown


class _NeverRefused(dict):
    """A refusal memo that never remembers: every try goes to the ledger."""

    def get(self, key, default=None):
        return None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "add", "release", "cancel", "drain"]),
                          st.integers(0, 5), st.integers(1, 4)), max_size=40))
def test_skipping_refused_tries_changes_no_outcome(ops):
    # two queues over two ledgers driven alike, one making every try: same starts, same
    # allocations (first-fit: the policy does not learn from the tries it is asked)
    def world():
        ledger = Ledger([make_node("n1", gpus=4), make_node("n2", gpus=2, cores=4)],
                        policy="first-fit")
        return ledger, WaitQueue(ledger, max_bypass=1)

    (la, qa), (lb, qb) = world(), world()
    qb._refused = _NeverRefused()
    for i, (op, user, n) in enumerate(ops):
        for ledger, q in ((la, qa), (lb, qb)):
            if op == "add":
                q.add(Owner(f"u{user}", str(i)), Bundle(cores=n, gpus=1 + n % 2,
                                                         memory_bytes=GiB, numa_policy="none"))
            elif op == "release" and ledger.allocations():
                ledger.release(ledger.allocations()[user % len(ledger.allocations())].id)
            elif op == "cancel" and len(q):
                q.remove(q.order()[user % len(q)].id)
            elif op == "drain":
                uuid = f"GPU-n1-{user % 4:02d}"
                if uuid in ledger.drained_gpus():
                    ledger.undrain_gpu(uuid)
                else:
                    ledger.drain_gpu(uuid, "test")
        outs = [[(o.entry.owner, o.allocation and (o.allocation.node, o.allocation.gpu_uuids))
                 for o in q.schedule()] for q in (qa, qb)]
        assert outs[0] == outs[1]
        assert [e.owner for e in qa.order()] == [e.owner for e in qb.order()]


def test_free_gpus_and_the_form_count_only_a_profiles_nodes():
    """A profile restricted to a full node: its waiting spawn's progress and its form card say
    "0 of 2 ... free now" (and the card "you will wait"), not the free GPUs of nodes it may not
    use (seen on the Slurm test cluster: "2 of 4 GPUs free now" while it waited)."""
    from gpuspawner.hub.form import profile_cards
    from gpuspawner.hub.profiles import load_profiles

    ledger = Ledger([make_node("n1", gpus=2), make_node("n2", gpus=2)], policy="first-fit")
    ledger.reserve(gpus(2), Owner("a", "x"), ["n1"])
    assert ledger.free_gpus() == (2, 4)
    assert ledger.free_gpus((), ["n1"]) == (0, 2)
    assert ledger.free_gpus(("A100",), ["n2"]) == (2, 2)
    (card,) = profile_cards(load_profiles([
        {"slug": "p", "display_name": "1 GPU on n1", "cpu": 1, "memory": "1G", "gpus": 1,
         "nodes": ["n1"]}]), ledger, "b", ())
    assert card["availability"] == "0 of 2 GPU free now"
    assert card["waits"] and card["available"]


def test_fair_share_over_time_puts_more_decayed_past_usage_behind():
    """Issue 41 item 5: equal holdings now (none), the user with more decayed past usage
    waits behind the one with less, though it arrived first; off again, arrival order."""
    from gpuspawner.placement.queue import decayed
    ledger = one_node(1)
    ledger.reserve(gpus(1), Owner("other", "held"))
    q = WaitQueue(ledger)
    q.add(Owner("heavy"), gpus(1))
    q.add(Owner("light"), gpus(1))
    assert [e.owner.user for e in q.order()] == ["heavy", "light"]  # plain DRF: FIFO tie
    week = 7 * 86400.0
    # heavy used 100 GPU-hours two weeks ago (25 after decay), light 10 GPU-hours just now
    past = {"heavy": decayed(100 * 3600, 2 * week, week), "light": decayed(10 * 3600, 0, week)}
    assert past["heavy"] == pytest.approx(25 * 3600)
    q.set_past_usage(past)
    assert [e.owner.user for e in q.order()] == ["light", "heavy"]
    f_heavy, f_light = q.fairshare_factor(Owner("heavy")), q.fairshare_factor(Owner("light"))
    assert 0 < f_heavy < f_light < 1
    # decayed long enough, heavy's old usage falls below light's: heavy is first again
    q.set_past_usage({"heavy": decayed(100 * 3600, 6 * week, week), "light": 10 * 3600})
    assert [e.owner.user for e in q.order()] == ["heavy", "light"]
    q.set_past_usage({})
    assert q.fairshare_factor(Owner("heavy")) == 1.0
    with pytest.raises(ValueError, match="heavy"):
        q.set_past_usage({"heavy": -1})
