"""Health in the ledger (a part of :class:`~.ledger.Ledger`): nodes that take no new work (drain,
down) and drained GPUs (held so that no new booking gets them)."""

from __future__ import annotations

from collections.abc import Mapping

from .model import GPU_MILLI, Allocation

#: what :meth:`Ledger.set_node_state` accepts
NODE_STATES = ("up", "drain", "down", "off")




class LedgerHealth:
    """Node states and GPU drains.

    A part of :class:`~.ledger.Ledger` (its lock ``_lock``, node states and indexes ``_c``, and
    allocations are the ledger's), kept in its own module by concern."""

    def set_node_state(self, name: str, state: str, reason: str = "") -> None:
        """Mark node ``name`` "up", "drain" (no new placements; what runs stays), "down"
        (no new placements; the caller stops and releases what ran there) or "off" (an
        elastic node not running now, :mod:`gpuspawner.elastic`: no placements, but its
        capacity *can start*, so a bundle that fits only it is admissible and waits while the
        node is started). Slurm's node states (slurm.conf(5): DRAIN, DOWN, NOT_RESPONDING)
        and a Docker engine that stops answering map onto the first three.

        Raises:
            KeyError: unknown node. ValueError: unknown state.
        """
        if state not in NODE_STATES:
            raise ValueError(f"node state must be one of {', '.join(NODE_STATES)}, got "
                             f"{state!r}")
        with self._lock:
            st = self._by_name[name]
            self._snap_dirty.add(name)
            if state == "up":
                if self._node_state.pop(name, None) is not None:
                    self._rebucket(st, self._bucket_key(st), grew=True)
            else:
                self._node_state[name] = (state, reason)

    def node_state(self, name: str) -> tuple[str, str]:
        """(state, reason) of node ``name``; ("up", "") unless set otherwise."""
        return self._node_state.get(name, ("up", ""))

    def drain_gpu(self, uuid: str, reason: str) -> str:
        """Take GPU ``uuid`` out of placement (unhealthy: NVML XID errors, ECC, retired pages;
        or an admin's choice): its free capacity is held, so no new allocation gets any of
        it; allocations already on it keep running and what they give back is held too.
        Returns the GPU's node. Draining a drained GPU updates the reason.

        A MIG-enabled GPU drained offers none of its MIG instances (those in use keep running).

        Raises:
            KeyError: no node has that GPU (a MIG instance's UUID: the message names its GPU,
                which is what is drained).
        """
        with self._lock:
            st = next((s for s in self._c.states if uuid in s.gpu_used), None)
            if st is None:
                parent = next((s.mig_by_uuid[uuid].gpu for s in self._c.states
                               if uuid in s.mig_by_uuid), None)
                if parent is not None:
                    raise KeyError(f"{uuid} is a MIG instance; drain its GPU {parent}")
                raise KeyError(f"no node has GPU {uuid}")
            self._snap_dirty.add(st.name)
            if uuid in self._drained:
                self._drained[uuid][1] = reason
                return st.name
            old = self._bucket_key(st)
            if st.gpu_by_uuid[uuid].mig_enabled:
                st.mig_drained.add(uuid)
            free = GPU_MILLI - st.gpu_used[uuid]
            st.gpu_used[uuid] += free
            self._drained[uuid] = [st.name, reason, free]
            st.refresh_signature()
            self._rebucket(st, old, grew=False)
            return st.name

    def undrain_gpu(self, uuid: str) -> None:
        """Give a drained GPU back to placement (nothing if it is not drained)."""
        with self._lock:
            entry = self._drained.pop(uuid, None)
            if entry is None:
                return
            st = self._by_name[entry[0]]
            self._snap_dirty.add(st.name)
            old = self._bucket_key(st)
            st.mig_drained.discard(uuid)
            st.gpu_used[uuid] -= entry[2]
            st.refresh_signature()
            self._rebucket(st, old, grew=True)

    def drained_gpus(self) -> dict[str, str]:
        """Drained GPUs: UUID -> reason."""
        with self._lock:
            return {u: d[1] for u, d in self._drained.items()}

    def _held(self, uuid: str) -> int:
        d = self._drained.get(uuid)
        return d[2] if d else 0

    def _unhold_for(self, alloc: Allocation) -> dict[str, int]:
        """Give back to ``alloc``'s drained GPUs as much of the hold as it books (restore of
        a server that runs there); returns what was taken, for :meth:`_rehold`."""
        taken: dict[str, int] = {}
        st = self._by_name.get(alloc.node)
        if st is None:
            return taken
        for g in alloc.gpus:
            d = self._drained.get(g.uuid)
            if d is not None and d[0] == alloc.node:
                n = min(d[2], g.milli)
                d[2] -= n
                st.gpu_used[g.uuid] -= n
                taken[g.uuid] = n
                self._snap_dirty.add(alloc.node)
        return taken

    def _rehold(self, node: str, taken: Mapping[str, int]) -> None:
        st = self._by_name[node] if taken else None
        if taken:
            self._snap_dirty.add(node)
        for uuid, n in taken.items():
            self._drained[uuid][2] += n
            st.gpu_used[uuid] += n  # type: ignore[union-attr]
