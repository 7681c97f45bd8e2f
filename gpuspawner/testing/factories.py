"""Small node factories for placement tests (plain data, no I/O)."""

from __future__ import annotations

from gpuspawner.placement import GPU, GPULink, Node, NumaNode

GiB = 1024**3


def make_node(name: str = "n1", *, gpus: int = 4, numa: int = 2, cores: int = 16,
              memory_gib: int = 64, model: str = "A100", shareable: bool = False,
              disk_gib: int = 100, gpu_numa: list[int] | None = None,
              nvlink_pairs: list[tuple[int, int]] = ()) -> Node:
    """A node with ``numa`` NUMA nodes splitting ``cores`` and memory evenly, and ``gpus`` GPUs
    spread evenly over the NUMA nodes (or placed by ``gpu_numa``). GPUs on one NUMA node are
    linked NODE, across SYSTEM, and ``nvlink_pairs`` (GPU indices) NVLINK."""
    per = cores // numa
    numa_nodes = tuple(NumaNode(i, tuple(range(i * per, (i + 1) * per)), memory_gib * GiB // numa)
                       for i in range(numa))
    where = gpu_numa or [i * numa // gpus for i in range(gpus)] if gpus else []
    uuids = [f"GPU-{name}-{i:02d}" for i in range(gpus)]
    out = []
    for i in range(gpus):
        links = {}
        for j in range(gpus):
            if i == j:
                continue
            link = GPULink.NODE if where[i] == where[j] else GPULink.SYSTEM
            if (i, j) in nvlink_pairs or (j, i) in nvlink_pairs:
                link = GPULink.NVLINK
            links[uuids[j]] = link
        out.append(GPU(uuids[i], i, model, 80 * GiB, f"00000000:{i + 1:02x}:00.0", where[i],
                       links, shareable))
    return Node(name, numa_nodes, tuple(out), disk_gib * GiB)
