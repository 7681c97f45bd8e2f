"""Topology files: the shipped examples, round trips through dump_topology, and errors."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from gpuspawner.inventory.topology import (
    TopologyError,
    default_link,
    dump_topology,
    load_topology_file,
    node_from_dict,
    node_to_dict,
)
from gpuspawner.placement.model import GPU, GPULink, Node, NumaNode

DATA = Path(__file__).parent / "data" / "topologies"
EXAMPLES = sorted(DATA.glob("*.yaml"))
GiB = 1024**3


def assert_same_node(a: Node, b: Node) -> None:
    """Equal as dataclasses and, beyond ``==`` (which ignores them), equal labels and links."""
    assert a == b
    assert dict(a.labels) == dict(b.labels)
    for ga, gb in zip(a.gpus, b.gpus, strict=True):
        for other in a.gpus:
            assert ga.link_to(other.uuid) == gb.link_to(other.uuid), (ga.uuid, other.uuid)


def write(tmp_path: Path, text: str, name: str = "topology.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- examples


def test_three_examples_are_shipped() -> None:
    assert {p.name for p in EXAMPLES} >= {"dgx-a100.yaml", "t4-pcie.yaml", "cpu-only.yaml"}


def test_dgx_a100_example() -> None:
    node = load_topology_file(DATA / "dgx-a100.yaml")
    assert node.name == "dgx-a100-1"
    assert dict(node.labels) == {"rack": "r1", "site": "dc1"}
    assert node.disk_bytes == 15 * 1024**4
    assert [n.id for n in node.numa_nodes] == [0, 1]
    assert node.cpu_count == 256
    assert node.numa_nodes[0].cpus == tuple(range(0, 64)) + tuple(range(128, 192))
    assert node.memory_bytes == 2 * 1024**4
    assert len(node.gpus) == 8
    assert [g.index for g in node.gpus] == list(range(8))
    assert {g.model for g in node.gpus} == {"A100"}
    assert all(g.memory_bytes == 80 * GiB for g in node.gpus)
    assert [g.numa_node for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert node.gpus[0].pci_bus_id == "00000000:07:00.0"
    for a, b in itertools.permutations(node.gpus, 2):
        assert a.link_to(b.uuid) is GPULink.NVLINK
    assert len({g.uuid for g in node.gpus}) == 8


def test_t4_example_links_and_defaults() -> None:
    node = load_topology_file(DATA / "t4-pcie.yaml")
    g = node.gpus
    assert len(g) == 4 and all(x.shareable for x in g) and g[0].model == "T4"
    assert g[0].memory_bytes == 15 * GiB
    assert g[0].link_to(g[1].uuid) is GPULink.SINGLE  # by index, "pix"
    assert g[1].link_to(g[0].uuid) is GPULink.SINGLE  # symmetric
    assert g[2].link_to(g[3].uuid) is GPULink.SINGLE  # by UUID, "single"
    assert g[0].link_to(g[2].uuid) is GPULink.SYSTEM  # default across NUMA nodes
    assert g[3].link_to(g[1].uuid) is GPULink.SYSTEM
    # every ordered pair is recorded explicitly
    assert all(len(x.links) == 3 for x in g)


def test_cpu_only_example() -> None:
    node = load_topology_file(DATA / "cpu-only.yaml")
    assert node.gpus == ()
    assert node.numa_nodes[1].cpus == tuple(range(32, 64))
    assert node.cpu_count == 64
    assert dict(node.labels) == {"burst": "true"}
    assert node.disk_bytes == 2 * 1024**4


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_round_trip(tmp_path: Path, path: Path) -> None:
    node = load_topology_file(path)
    out = write(tmp_path, dump_topology(node), "dumped.yaml")
    assert_same_node(load_topology_file(out), node)


def test_default_link_same_numa_is_node() -> None:
    node = node_from_dict({
        "name": "n", "numa_nodes": [{"id": 0, "cpus": "0-3", "memory": "1G"},
                                    {"id": 1, "cpus": "4-7", "memory": "1G"}],
        "gpus": [{"uuid": "GPU-a", "numa_node": 0}, {"uuid": "GPU-b", "numa_node": 0},
                 {"uuid": "GPU-c", "numa_node": 1}, {"uuid": "GPU-d", "numa_node": None}],
    })
    a, b, c, d = node.gpus
    assert a.link_to("GPU-b") is GPULink.NODE
    assert a.link_to("GPU-c") is GPULink.SYSTEM
    assert d.link_to("GPU-a") is GPULink.SYSTEM  # unknown NUMA node: not assumed close
    assert d.numa_node is None
    assert default_link(a, b) is GPULink.NODE and default_link(a, d) is GPULink.SYSTEM


def test_defaults_of_optional_fields() -> None:
    node = node_from_dict({"name": " solo ", "numa_nodes": [{"id": 3, "cpus": 5, "memory": 100}],
                           "gpus": [{"uuid": "GPU-x"}, {"uuid": "GPU-y"}]})
    assert node.name == "solo"
    assert node.disk_bytes == 0 and dict(node.labels) == {}
    assert node.numa_nodes == (NumaNode(3, (5,), 100),)
    x, y = node.gpus
    assert (x.index, y.index) == (0, 1)
    assert x.numa_node == 3  # the only NUMA node
    assert x.model == "" and x.memory_bytes == 0 and x.shareable is False


def test_labels_are_strings() -> None:
    node = node_from_dict({"name": "n", "labels": {"burst": True, "slots": 4, "tier": "a"},
                           "numa_nodes": [{"id": 0, "cpus": "0", "memory": "1G"}]})
    assert dict(node.labels) == {"burst": "true", "slots": "4", "tier": "a"}


def test_sizes_decimal_and_binary() -> None:
    node = node_from_dict({"name": "n", "disk": "1TB",
                           "numa_nodes": [{"id": 0, "cpus": "0-1", "memory": "1.5Gi"}]})
    assert node.disk_bytes == 10**12
    assert node.numa_nodes[0].memory_bytes == 3 * 512 * 1024**2


def test_round_trip_of_unusual_node(tmp_path: Path) -> None:
    """Odd sizes, unknown NUMA node, a missing link entry on one NUMA node (link_to gives
    SYSTEM although the file default would be NODE), all link levels."""
    levels = list(GPULink)
    gpus = []
    uuids = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(len(levels) + 2)]
    for i, u in enumerate(uuids):
        links = {}
        for j, v in enumerate(uuids):
            if j != i and i < len(levels) and j < len(levels):
                links[v] = levels[min(i, j)]
        gpus.append(GPU(uuid=u, index=10 + i, model="RTX 4090", memory_bytes=24 * GiB + 7,
                        pci_bus_id="00000000:00:00.0" if i == 0 else f"0001:{i:02X}:00.0",
                        numa_node=None if i == 1 else 0, links=links, shareable=i % 2 == 0))
    node = Node(name="odd", numa_nodes=(NumaNode(0, (0, 2, 4, 5, 6), 12345),),
                gpus=tuple(gpus), disk_bytes=1023, labels={"a b": "c: d", "n": "007"})
    text = dump_topology(node)
    back = load_topology_file(write(tmp_path, text))
    assert_same_node(back, node)
    last, before = back.gpus[-1], back.gpus[-2]
    assert last.link_to(before.uuid) is GPULink.SYSTEM  # not the NODE default
    assert back.gpus[0].pci_bus_id == "00000000:00:00.0"  # not read back as a number
    assert back.labels["n"] == "007"
    assert node_to_dict(back) == node_to_dict(node)


def test_dump_writes_only_non_default_links() -> None:
    node = load_topology_file(DATA / "t4-pcie.yaml")
    data = node_to_dict(node)
    assert sorted(lvl for _, _, lvl in data["links"]) == ["single", "single"]
    assert "links" not in node_to_dict(load_topology_file(DATA / "cpu-only.yaml"))


# --------------------------------------------------------------------------- errors

GOOD_HEAD = """\
name: n
numa_nodes:
  - {id: 0, cpus: "0-3", memory: 8G}
  - {id: 1, cpus: "4-7", memory: 8G}
"""

TWO_GPUS = GOOD_HEAD + """\
gpus:
  - {uuid: GPU-a, numa_node: 0}
  - {uuid: GPU-b, numa_node: 1}
"""

BROKEN = [
    # (id, file text, field, words in the problem)
    ("top-level-list", "- a\n- b\n", "", "must be a mapping"),
    ("missing-name", 'numa_nodes: [{id: 0, cpus: "0", memory: 1G}]\n', "name", "missing"),
    ("empty-name", 'name: ""\nnuma_nodes: [{id: 0, cpus: "0", memory: 1G}]\n', "name",
     "non-empty"),
    ("unknown-top-key", GOOD_HEAD + "gpu: []\n", "gpu", "unknown key"),
    ("missing-numa", "name: n\n", "numa_nodes", "missing"),
    ("empty-numa", "name: n\nnuma_nodes: []\n", "numa_nodes", "non-empty"),
    ("numa-missing-memory", 'name: n\nnuma_nodes: [{id: 0, cpus: "0"}]\n',
     "numa_nodes[0].memory", "missing"),
    ("numa-unknown-key", 'name: n\nnuma_nodes: [{id: 0, cpus: "0", memory: 1G, mem: 2G}]\n',
     "numa_nodes[0].mem", "unknown key"),
    ("numa-dup-id", 'name: n\nnuma_nodes: [{id: 0, cpus: "0", memory: 1G},\n'
     '  {id: 0, cpus: "1", memory: 1G}]\n', "numa_nodes[1].id", "declared twice"),
    ("numa-neg-id", 'name: n\nnuma_nodes: [{id: -1, cpus: "0", memory: 1G}]\n',
     "numa_nodes[0].id", "integer >= 0"),
    ("dup-cpu", 'name: n\nnuma_nodes: [{id: 0, cpus: "0-3", memory: 1G},\n'
     '  {id: 1, cpus: "3-5", memory: 1G}]\n', "numa_nodes[1].cpus", "CPU 3 is already"),
    ("dup-cpu-in-list", 'name: n\nnuma_nodes: [{id: 0, cpus: [1, 2, 1], memory: 1G}]\n',
     "numa_nodes[0].cpus[2]", "listed twice"),
    ("bad-cpulist", 'name: n\nnuma_nodes: [{id: 0, cpus: "0-x", memory: 1G}]\n',
     "numa_nodes[0].cpus", "not a CPU list"),
    ("reversed-cpulist", 'name: n\nnuma_nodes: [{id: 0, cpus: "7-3", memory: 1G}]\n',
     "numa_nodes[0].cpus", "not a CPU list"),
    ("no-cpus", 'name: n\nnuma_nodes: [{id: 0, cpus: "", memory: 1G}]\n', "numa_nodes",
     "no CPUs"),
    ("bad-size", 'name: n\nnuma_nodes: [{id: 0, cpus: "0", memory: 12 parsecs}]\n',
     "numa_nodes[0].memory", "not a size"),
    ("negative-size", 'name: n\ndisk: -5\nnuma_nodes: [{id: 0, cpus: "0", memory: 1G}]\n',
     "disk", ">= 0"),
    ("bool-size", 'name: n\ndisk: yes\nnuma_nodes: [{id: 0, cpus: "0", memory: 1G}]\n',
     "disk", "not a size"),
    ("labels-nested", GOOD_HEAD + "labels: {rack: [1, 2]}\n", "labels.rack", "scalars"),
    ("gpus-not-list", GOOD_HEAD + "gpus: {uuid: GPU-a}\n", "gpus", "must be a list"),
    ("gpu-no-uuid", GOOD_HEAD + "gpus: [{index: 0, numa_node: 0}]\n", "gpus[0].uuid",
     "missing"),
    ("gpu-unknown-key", GOOD_HEAD + "gpus: [{uuid: GPU-a, numa_node: 0, numa: 1}]\n",
     "gpus[0].numa", "unknown key"),
    ("gpu-dup-uuid", TWO_GPUS.replace("GPU-b", "GPU-a"), "gpus[1].uuid", "duplicate GPU UUID"),
    ("gpu-dup-index", GOOD_HEAD + "gpus:\n  - {uuid: GPU-a, index: 1, numa_node: 0}\n"
     "  - {uuid: GPU-b, index: 1, numa_node: 0}\n", "gpus[1].index", "duplicate GPU index"),
    ("gpu-undeclared-numa", GOOD_HEAD + "gpus:\n  - {uuid: GPU-a, numa_node: 0}\n"
     "  - {uuid: GPU-b, numa_node: 3}\n", "gpus[1].numa_node", "NUMA node 3 is not declared"),
    ("gpu-numa-omitted", GOOD_HEAD + "gpus: [{uuid: GPU-a}]\n", "gpus[0].numa_node",
     "more than one NUMA node"),
    ("gpu-bad-memory", GOOD_HEAD + "gpus: [{uuid: GPU-a, numa_node: 0, memory: lots}]\n",
     "gpus[0].memory", "not a size"),
    ("gpu-shareable-string", GOOD_HEAD + 'gpus: [{uuid: GPU-a, numa_node: 0, shareable: "no"}]\n',
     "gpus[0].shareable", "true or false"),
    ("gpu-bus-number", GOOD_HEAD + "gpus: [{uuid: GPU-a, numa_node: 0, pci_bus_id: 12}]\n",
     "gpus[0].pci_bus_id", "must be a string"),
    ("link-bad-name", TWO_GPUS + "links: [[GPU-a, GPU-b, warp]]\n", "links[0][2]",
     "unknown GPU link"),
    ("link-unknown-uuid", TWO_GPUS + "links: [[GPU-a, GPU-z, nvlink]]\n", "links[0][1]",
     "no GPU has UUID GPU-z"),
    ("link-unknown-index", TWO_GPUS + "links: [[0, 7, nvlink]]\n", "links[0][1]",
     "no GPU has index 7"),
    ("link-wrong-shape", TWO_GPUS + "links: [[GPU-a, GPU-b]]\n", "links[0]", "[gpu, gpu, link]"),
    ("link-self", TWO_GPUS + "links: [[GPU-a, 0, nvlink]]\n", "links[0]", "two different"),
    ("link-contradiction", TWO_GPUS + "links:\n  - [GPU-a, GPU-b, nvlink]\n"
     "  - [GPU-b, GPU-a, sys]\n", "links[1]", "contradicts links[0]"),
    ("links-not-list", TWO_GPUS + "links: {GPU-a: GPU-b}\n", "links", "must be a list"),
]


@pytest.mark.parametrize(("text", "field", "words"), [b[1:] for b in BROKEN],
                         ids=[b[0] for b in BROKEN])
def test_broken_files(tmp_path: Path, text: str, field: str, words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TopologyError) as info:
        load_topology_file(path)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.source == str(path)
    assert err.field == field
    assert words in err.problem
    prefix = f"{path}: {field}: " if field else f"{path}: "
    assert str(err).startswith(prefix)


def test_repeated_link_with_same_level_is_fine(tmp_path: Path) -> None:
    node = load_topology_file(write(tmp_path, TWO_GPUS + "links:\n  - [GPU-a, GPU-b, nv12]\n"
                                    "  - [1, 0, NVLINK]\n"))
    assert node.gpus[0].link_to("GPU-b") is GPULink.NVLINK


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    text = GOOD_HEAD + "gpus:\n  - uuid: GPU-a\n    numa_node: 0\n   model: [A100\n"
    path = write(tmp_path, text)
    with pytest.raises(TopologyError) as info:
        load_topology_file(path)
    err = info.value
    assert err.field == ""
    assert err.line is not None and 7 <= err.line <= 8
    assert str(err).startswith(f"{path}: YAML syntax error at line {err.line}")


def test_file_not_found(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(TopologyError, match="nope.yaml: file not found") as info:
        load_topology_file(path)
    assert info.value.source == str(path)


def test_empty_file(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="file is empty"):
        load_topology_file(write(tmp_path, "# nothing\n"))


def test_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="directory"):
        load_topology_file(tmp_path)


def test_safe_load_refuses_python_objects(tmp_path: Path) -> None:
    path = write(tmp_path, "!!python/object/apply:os.system [echo hi]\n")
    with pytest.raises(TopologyError, match="YAML"):
        load_topology_file(path)


def test_node_from_dict_default_source() -> None:
    with pytest.raises(TopologyError) as info:
        node_from_dict({"name": "n", "numa_nodes": "0-3"})
    assert info.value.source == "<dict>"
    assert str(info.value).startswith("<dict>: numa_nodes: ")
