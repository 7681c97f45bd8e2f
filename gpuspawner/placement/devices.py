"""Level two of the placement: which GPUs, CPU ids and NUMA memory of one node a bundle gets.

Rules (in order):

1. GPUs: whole GPUs are taken only when untouched (0 milli used); a share (1..999 milli-GPU) only
   on a shareable GPU with room, best fit first (the fullest GPU that still has room), so that
   shares pack and whole GPUs stay whole (the GPU-level choice of Weng et al., ATC '23).
2. Links: among candidate sets, the GPUs whose worst pairwise link is best (NVLink island, then
   one PCIe switch, then host bridge, then one socket, then across sockets; NVML's
   ``nvmlDeviceGetTopologyCommonAncestor`` levels), then the smallest sum of links.
3. NUMA: with alignment, GPUs, CPU ids and memory come from the *fewest* NUMA nodes that can hold
   the bundle on this node (one NUMA node whenever one is large enough), and memory is bound to
   exactly those nodes (``cpuset.mems``). Among equal choices, the NUMA node(s) left with the
   fewest free GPUs win, so whole GPU-local NUMA nodes stay free for later multi-GPU bundles.
4. CPU-only bundles go to NUMA nodes without free GPUs first, then best fit on cores, so GPU-local
   cores stay with the GPUs.
5. MIG (``Bundle.mig``): a node fits when it has ``mig_count`` free instances of the profile on
   a parent GPU of an allowed model; best fit again: instances on the parent GPU with the
   fewest free slices first (then parent index, instance index), so MIG work packs and
   wholly free MIG GPUs stay free. GPUs with MIG mode on are never candidates for whole GPUs or
   shares (:class:`~.state.NodeState` counts them fully used). NUMA alignment as in rule 3,
   with an instance on its parent GPU's NUMA node.
6. One user's shares per GPU (``NodeState.one_user_shares``: nodes whose shares run under
   gpuspawner's MPS control daemons, ``gpu_share: mps-daemon``): a GPU holding shares of one
   user is no candidate for another user's share (:func:`share_blocked`), because the MPS
   clients of one GPU share its daemon's IPC namespace (docs/gpu-sharing.md, MPS). Applied
   when the caller names the share's ``user``; whole GPUs (taken only when untouched) and
   MIG instances are not MPS clients and are unaffected, and the same user's next share
   joins their GPU as rule 1 says.

Everything here is pure: it reads a :class:`~.state.NodeState` and returns a
:class:`~.state.Plan` or None.
"""

from __future__ import annotations

from itertools import combinations

from .model import GPU, GPU_MILLI, Bundle, GPULink, MigInstance
from .state import NodeState, Plan


def model_allowed(gpu: GPU, bundle: Bundle) -> bool:
    """True when the GPU's model is one the bundle allows (case-insensitive; empty = any)."""
    if not bundle.gpu_models:
        return True
    model = gpu.model.lower()
    return any(m.lower() == model for m in bundle.gpu_models)


def share_blocked(state: NodeState, uuid: str, user: str | None) -> bool:
    """True when GPU ``uuid`` of this node may not take a share of ``user`` (rule 6): the node
    keeps one user's shares per GPU and the GPU holds shares of someone else. Always False
    when ``user`` is None (no owner named: the rule is not applied)."""
    if user is None or not state.one_user_shares:
        return False
    users = state.share_users.get(uuid)
    return bool(users) and (len(users) > 1 or user not in users)


def gpu_candidates(state: NodeState, bundle: Bundle, numa_ids: tuple[int, ...],
                   user: str | None = None) -> list[GPU]:
    """GPUs on the given NUMA nodes that can serve the bundle now (free whole GPUs, or shareable
    GPUs with enough free milli-GPU for a share, none of them another user's under rule 6
    when ``user`` is named)."""
    out = []
    for nid in numa_ids:
        for g in state.gpus_by_numa[nid]:
            if not model_allowed(g, bundle):
                continue
            used = state.gpu_used[g.uuid]
            if bundle.gpus:
                if used == 0:
                    out.append(g)
            elif (g.shareable and used + bundle.gpu_milli <= GPU_MILLI
                  and (user is None or not share_blocked(state, g.uuid, user))):
                out.append(g)
    return out


def min_numa_count(state: NodeState, bundle: Bundle) -> int | None:
    """Fewest NUMA nodes of this node that could hold the bundle if the node were empty, or None
    if the whole node could not. This is what ``strict`` alignment asks for. Cached per node
    and bundle shape (it depends on the hardware only)."""
    key = (bundle.gpus, bundle.gpu_milli > 0, bundle.gpu_models, bundle.cores,
           bundle.memory_bytes)
    if bundle.mig:
        key += (bundle.mig, bundle.mig_count)
    try:
        return state.cache[key]
    except KeyError:
        pass
    if len(state.cache) > 4096:
        state.cache.clear()
    out = state.cache[key] = _min_numa_count(state, bundle)
    return out


def _min_numa_count(state: NodeState, bundle: Bundle) -> int | None:
    node = state.node
    if bundle.mig:
        k_cap = sorted((sum(1 for m in state.mig_by_numa[n] if m.profile == bundle.mig
                            and model_allowed(state.gpu_by_uuid[m.gpu], bundle))
                        for n in state.numa_ids), reverse=True)
    else:
        k_cap = sorted((sum(1 for g in state.gpus_by_numa[n] if model_allowed(g, bundle)
                            and (bundle.gpus or g.shareable) and not g.mig_enabled)
                        for n in state.numa_ids), reverse=True)
    cpu_cap = sorted((len(n.cpus) for n in node.numa_nodes), reverse=True)
    mem_cap = sorted((n.memory_bytes for n in node.numa_nodes), reverse=True)

    def need(caps: list[int], amount: int) -> int | None:
        if amount <= 0:
            return 0
        total = 0
        for i, c in enumerate(caps):
            total += c
            if total >= amount:
                return i + 1
        return None

    gpu_need = bundle.gpus if bundle.gpus else (1 if bundle.gpu_milli else bundle.mig_units)
    parts = [need(k_cap, gpu_need), need(cpu_cap, bundle.cores),
             need(mem_cap, bundle.memory_bytes)]
    if any(p is None for p in parts):
        return None
    return max(1, *(p for p in parts if p is not None))


def mig_candidates(state: NodeState, bundle: Bundle,
                   numa_ids: tuple[int, ...]) -> list[MigInstance]:
    """Free MIG instances of the bundle's profile on the given NUMA nodes, on parent GPUs of an
    allowed model, best fit first (rule 5): the parent with the fewest free slices, then the
    parent's index, then the instance's index and UUID."""
    free = state.mig_free
    out = [m for nid in numa_ids for m in state.mig_by_numa[nid]
           if m.profile == bundle.mig and free(m)
           and model_allowed(state.gpu_by_uuid[m.gpu], bundle)]
    if len(out) > 1:
        free_slices: dict[str, int] = {}
        for m in state.mig_by_uuid.values():
            if free(m):
                free_slices[m.gpu] = free_slices.get(m.gpu, 0) + m.slices
        out.sort(key=lambda m: (free_slices[m.gpu], state.gpu_by_uuid[m.gpu].index, m.gpu,
                                m.index, m.uuid))
    return out


def pick_gpus(cands: list[GPU], k: int) -> tuple[list[GPU], tuple[int, int]]:
    """Choose ``k`` of ``cands`` with the best links: greedy growth from every start GPU, keeping
    the set with the smallest (worst pairwise link, sum of pairwise links). Returns the GPUs and
    that score. ``len(cands) >= k >= 1`` is required."""
    if k == 1:
        return [cands[0]], (0, 0)
    best: tuple[list[GPU], tuple[int, int]] | None = None
    for start in cands:
        chosen = [start]
        worst = 0
        total = 0
        rest = [g for g in cands if g is not start]
        while len(chosen) < k:
            pick = None
            pick_key = None
            for g in rest:
                links = [int(g.link_to(c.uuid)) for c in chosen]
                key = (max(links), sum(links))
                if pick_key is None or key < pick_key:
                    pick, pick_key = g, key
            assert pick is not None and pick_key is not None
            chosen.append(pick)
            rest.remove(pick)
            worst = max(worst, pick_key[0])
            total += pick_key[1]
        score = (worst, total)
        if best is None or score < best[1]:
            best = (chosen, score)
        if int(GPULink.INTERNAL) == worst and total == 0:
            break
    assert best is not None
    return best


def _take_cpus(state: NodeState, numa_order: list[int], cores: int) -> list[int]:
    cpus: list[int] = []
    for nid in numa_order:
        if len(cpus) >= cores:
            break
        free = sorted(state.free_cpus[nid])
        cpus.extend(free[: cores - len(cpus)])
    return cpus


def _take_memory(state: NodeState, numa_order: list[int], amount: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    left = amount
    for nid in numa_order:
        if left <= 0:
            break
        take = min(left, state.free_mem[nid])
        if take > 0:
            out.append((nid, take))
            left -= take
    return out if left <= 0 else []


def _free_gpus_on(state: NodeState, numa_ids) -> int:
    return sum(1 for n in numa_ids for g in state.gpus_by_numa[n] if state.gpu_used[g.uuid] == 0)


def _choose_gpus(state: NodeState, bundle: Bundle, cands: list[GPU]):
    """(chosen (uuid, milli) list, link score) or None (whole GPUs and shares; MIG instances
    are chosen by :func:`_choose_mig`)."""
    if bundle.gpus:
        if len(cands) < bundle.gpus:
            return None
        chosen, score = pick_gpus(cands, bundle.gpus)
        return [(g.uuid, GPU_MILLI) for g in chosen], score
    if bundle.gpu_milli:
        if not cands:
            return None
        g = min(cands, key=lambda g: (GPU_MILLI - state.gpu_used[g.uuid], g.index, g.uuid))
        return [(g.uuid, bundle.gpu_milli)], (0, GPU_MILLI - state.gpu_used[g.uuid])
    return [], (0, 0)


def _choose_mig(state: NodeState, bundle: Bundle, numa_ids: tuple[int, ...]):
    """(chosen instances, score) on these NUMA nodes, or None when too few are free."""
    cands = mig_candidates(state, bundle, numa_ids)
    if len(cands) < bundle.mig_count:
        return None
    chosen = cands[: bundle.mig_count]
    return chosen, (0, 0)


def _plan_mig(state: NodeState, bundle: Bundle, allow_spill: bool) -> Plan | None:
    """Rule 5 with rule 3: the fewest NUMA nodes holding the instances, cores and memory;
    with ``allow_spill`` the instances anywhere on the node as a fallback."""
    m = min_numa_count(state, bundle)
    best = None
    best_key = None
    if m is not None:
        for numa_set in combinations(state.numa_ids, m):
            if sum(len(state.free_cpus[n]) for n in numa_set) < bundle.cores:
                continue
            if sum(state.free_mem[n] for n in numa_set) < bundle.memory_bytes:
                continue
            chosen = _choose_mig(state, bundle, numa_set)
            if chosen is None:
                continue
            free_after = len(mig_candidates(state, bundle, numa_set)) - bundle.mig_count
            cores_after = sum(len(state.free_cpus[n]) for n in numa_set) - bundle.cores
            key = (free_after, cores_after, numa_set)
            if best_key is None or key < best_key:
                best_key, best = key, (numa_set, chosen[0])
    aligned = best is not None
    if best is None:
        if not allow_spill:
            return None
        chosen = _choose_mig(state, bundle, state.numa_ids)
        if chosen is None:
            return None
        if state.free_cpu_count() < bundle.cores or state.free_memory() < bundle.memory_bytes:
            return None
        best = (state.numa_ids, chosen[0])
    numa_set, insts = best
    inst_numa = [state.gpu_numa[i.gpu] for i in insts]
    order = sorted(numa_set, key=lambda n: (-inst_numa.count(n), -len(state.free_cpus[n]), n))
    cpus = _take_cpus(state, order, bundle.cores)
    if len(cpus) < bundle.cores:
        return None
    cpu_numa = [state.cpu_numa[c] for c in cpus]
    mem_order = sorted(order, key=lambda n: (-cpu_numa.count(n), -state.free_mem[n], n))
    mem = _take_memory(state, mem_order, bundle.memory_bytes)
    if bundle.memory_bytes and not mem:
        return None
    if not mem:
        mem = [(n, 0) for n in order[: max(1, len({*inst_numa}))]]
    note = ""
    if not aligned:
        used = set(inst_numa) | set(cpu_numa) | {n for n, _ in mem}
        aligned = len(used) <= (m or len(state.numa_ids))
        if not aligned:
            note = "spilled across NUMA nodes: MIG instances, cores and memory not on one"
    return Plan(gpus=[], cpus=cpus, memory_by_numa=mem, aligned=aligned, note=note,
                mig=[i.uuid for i in insts])


def plan_aligned(state: NodeState, bundle: Bundle, user: str | None = None) -> Plan | None:
    """Place the bundle on the fewest NUMA nodes that can hold it (rule 3), or None; ``user``:
    the share's owner (rule 6)."""
    m = min_numa_count(state, bundle)
    if m is None:
        return None
    best = None
    best_key = None
    wants_gpu = bool(bundle.gpus or bundle.gpu_milli)
    for numa_set in combinations(state.numa_ids, m):
        if sum(len(state.free_cpus[n]) for n in numa_set) < bundle.cores:
            continue
        if sum(state.free_mem[n] for n in numa_set) < bundle.memory_bytes:
            continue
        cands = gpu_candidates(state, bundle, numa_set, user) if wants_gpu else []
        chosen = _choose_gpus(state, bundle, cands)
        if chosen is None:
            continue
        gpus, link_score = chosen
        free_gpus_after = _free_gpus_on(state, numa_set) - (bundle.gpus or 0)
        cores_after = sum(len(state.free_cpus[n]) for n in numa_set) - bundle.cores
        key = (link_score, free_gpus_after, cores_after, numa_set)
        if best_key is None or key < best_key:
            best_key, best = key, (numa_set, gpus)
    if best is None:
        return None
    numa_set, gpus = best
    gpu_numa = [state.gpu_numa[u] for u, _ in gpus]
    order = sorted(numa_set, key=lambda n: (-gpu_numa.count(n), -len(state.free_cpus[n]), n))
    cpus = _take_cpus(state, order, bundle.cores)
    cpu_numa = [state.cpu_numa[c] for c in cpus]
    mem_order = sorted(order, key=lambda n: (-cpu_numa.count(n), -state.free_mem[n], n))
    mem = _take_memory(state, mem_order, bundle.memory_bytes)
    if bundle.memory_bytes and not mem:
        return None
    if not mem and bundle.memory_bytes == 0:
        # bind to the NUMA node(s) of the cores/GPUs even with no memory booked
        mem = [(n, 0) for n in order[: max(1, len({*gpu_numa}))]]
    return Plan(gpus=gpus, cpus=cpus, memory_by_numa=mem, aligned=True)


def plan_spill(state: NodeState, bundle: Bundle, user: str | None = None) -> Plan | None:
    """Place the bundle anywhere on the node, as close as the free devices allow, or None.
    The plan's ``aligned`` and ``note`` say whether it spilled across NUMA nodes; ``user``:
    the share's owner (rule 6)."""
    if state.free_cpu_count() < bundle.cores or state.free_memory() < bundle.memory_bytes:
        return None
    wants_gpu = bool(bundle.gpus or bundle.gpu_milli)
    cands = gpu_candidates(state, bundle, state.numa_ids, user) if wants_gpu else []
    chosen = _choose_gpus(state, bundle, cands)
    if chosen is None:
        return None
    gpus, _ = chosen
    gpu_numa = [state.gpu_numa[u] for u, _ in gpus]
    order = sorted(state.numa_ids, key=lambda n: (-gpu_numa.count(n),
                                                   _free_gpus_on(state, (n,)),
                                                   -len(state.free_cpus[n]), n))
    cpus = _take_cpus(state, order, bundle.cores)
    cpu_set = set(cpus)
    cpu_numa_used = [n for n in order if cpu_set & state.free_cpus[n]]
    mem_order = cpu_numa_used + [n for n in order if n not in cpu_numa_used]
    mem_order.sort(key=lambda n: (-gpu_numa.count(n), n not in cpu_numa_used,
                                  -state.free_mem[n]))
    mem = _take_memory(state, mem_order, bundle.memory_bytes)
    if bundle.memory_bytes and not mem:
        return None
    if not mem:
        mem = [(n, 0) for n in (cpu_numa_used or order[:1])]
    used = set(gpu_numa) | set(cpu_numa_used) | {n for n, _ in mem}
    aligned = len(used) <= (min_numa_count(state, bundle) or len(state.numa_ids))
    note = ""
    if not aligned:
        def fmt(ns):
            return ",".join(str(n) for n in sorted(set(ns))) or "-"
        note = (f"spilled across NUMA nodes: GPUs on {fmt(gpu_numa)}, cores on "
                f"{fmt(cpu_numa_used)}, memory on {fmt(n for n, _ in mem)}")
    return Plan(gpus=gpus, cpus=cpus, memory_by_numa=mem, aligned=aligned, note=note)


def plan(state: NodeState, bundle: Bundle, allow_spill: bool,
         user: str | None = None) -> Plan | None:
    """Devices for ``bundle`` on this node, or None when they are not free.

    With ``allow_spill`` False only an aligned plan (rule 3) is returned; with True an aligned
    plan is still preferred and a spilled one is the fallback. ``numa_policy="none"`` bundles
    are planned with spill allowed by the ledger. ``user``: the owner of a share, for rule 6
    (None: not applied; the ledger names it, the node-selection policies do not).
    """
    if state.free_disk < bundle.disk_bytes:
        return None
    if bundle.mig:
        return _plan_mig(state, bundle, allow_spill)
    p = plan_aligned(state, bundle, user)
    if p is not None or not allow_spill:
        return p
    return plan_spill(state, bundle, user)


def quick_fit(state: NodeState, bundle: Bundle, aligned: bool = False,
              user: str | None = None) -> bool:
    """Cheap necessary condition for :func:`plan` (node totals, and with ``aligned`` the
    per-NUMA-node condition when one NUMA node must hold the bundle); False = surely no fit.
    ``user``: as :func:`plan`'s."""
    if state.free_disk < bundle.disk_bytes:
        return False
    if state.free_cpu_count() < bundle.cores or state.free_memory() < bundle.memory_bytes:
        return False
    if aligned and min_numa_count(state, bundle) == 1:
        for nid in state.numa_ids:
            if (len(state.free_cpus[nid]) >= bundle.cores
                    and state.free_mem[nid] >= bundle.memory_bytes
                    and _gpus_fit(state, bundle, state.gpus_by_numa[nid], user)):
                return True
        return False
    return _gpus_fit(state, bundle, state.node.gpus, user)


def _gpus_fit(state: NodeState, bundle: Bundle, gpus: tuple[GPU, ...],
              user: str | None = None) -> bool:
    if bundle.mig:
        n = 0
        for g in gpus:
            if g.mig and model_allowed(g, bundle):
                n += sum(1 for m in g.mig if m.profile == bundle.mig and state.mig_free(m))
        return n >= bundle.mig_count
    if bundle.gpus:
        n = 0
        for g in gpus:
            if state.gpu_used[g.uuid] == 0 and model_allowed(g, bundle):
                n += 1
        return n >= bundle.gpus
    if bundle.gpu_milli:
        for g in gpus:
            if (g.shareable and state.gpu_used[g.uuid] + bundle.gpu_milli <= GPU_MILLI
                    and model_allowed(g, bundle)
                    and (user is None or not share_blocked(state, g.uuid, user))):
                return True
        return False
    return True
