"""The Slurm backend's pure pieces, without a cluster: GRES types and gres.conf from topology
files (gpuspawner.backends.slurm.gres, ``gpuspawner slurm-gres``), the parsers of
``scontrol show job -d`` / ``scontrol show node`` on output captured from the private cluster of
scripts/slurm.sh (tests/data/slurm/), and the command client against stand-in commands."""

from __future__ import annotations

import asyncio
import re
import stat
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuspawner.backends.slurm.commands import (
    GresAlloc,
    SlurmClient,
    SlurmError,
    expand_cpu_ids,
    expand_hostlist,
    parse_gres_detail,
    parse_job,
    parse_jobs,
    parse_key_values,
    parse_node_state,
    parse_nodes,
)
from gpuspawner.backends.slurm.gres import (
    GresError,
    check_types,
    gres_conf,
    gres_type,
    node_gres,
    slurm_gres_id,
)
from gpuspawner.cli import main
from gpuspawner.inventory.topology import load_topology_file, node_from_dict

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "slurm"
NODE1 = REPO / "hub_config" / "slurm" / "node1.yaml"
NODE2 = REPO / "hub_config" / "slurm" / "node2.yaml"

# the GPUs of hub_config/slurm/node2.yaml, index order
N2_A = "GPU-9e3b7f20-1c8a-4d6f-b5e4-0a7c3d2e1f52"
N2_B = "GPU-1f8d4c63-e2a7-4b19-9d30-5c6e7a8b9c63"
T_N1_B = "gpu-c4e2a9d1-7b36-4f05-8a1e-2f9b5d6c7e41"


def fixture_text(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


# --------------------------------------------------------------------------- GRES types

# What Slurm 22.05 takes as one Type in `gpu:TYPE:1` (src/common/gres.c, see gres.py): no
# separators, no config syntax, and not something _is_valid_number reads as a count.
SLURM_TYPE = re.compile(r"^[a-z][a-z0-9_-]*$")


def test_gres_type_of_an_nvml_uuid_is_the_lower_case_uuid() -> None:
    assert gres_type("GPU-5a0c1e7b-3f4d-4b8e-9c21-6d0e8f1a2b30") == \
        "gpu-5a0c1e7b-3f4d-4b8e-9c21-6d0e8f1a2b30"
    assert gres_type("  MIG-5a0c1e7b-3f4d-4b8e-9c21-6d0e8f1a2b30\n") == \
        "mig-5a0c1e7b-3f4d-4b8e-9c21-6d0e8f1a2b30"


def test_gres_type_escapes_what_slurm_would_split_on() -> None:
    # the pre-R470 MIG form holds slashes; '_' itself is escaped so the mapping stays 1:1
    assert gres_type("MIG-GPU-5a0c1e7b/1/0") == "mig-gpu-5a0c1e7b_2f1_2f0"
    assert gres_type("GPU-a_b") == "gpu-a_5fb"
    assert gres_type("GPU-a/b") != gres_type("GPU-a_2fb")
    for bad in ("GPU-x:1", "GPU-x,y", "GPU-x(S:0)", "GPU-x=y", "GPU-x y", "GPU-x#y"):
        assert SLURM_TYPE.match(gres_type(bad)), bad


@pytest.mark.parametrize("uuid", ["", "   ", "0fd630f1-f29d", "-GPU", "_x", "ü-GPU"])
def test_gres_type_refuses_a_uuid_that_does_not_start_with_a_letter(uuid: str) -> None:
    with pytest.raises(GresError, match="must start with a letter"):
        gres_type(uuid)


uuids = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@given(a=uuids, b=uuids)
def test_gres_type_is_valid_and_one_to_one_up_to_letter_case(a: str, b: str) -> None:
    a, b = "GPU-" + a, "GPU-" + b
    ta, tb = gres_type(a), gres_type(b)
    assert SLURM_TYPE.match(ta)
    assert ta != "no_consume"
    assert (ta == tb) == (a.strip().lower() == b.strip().lower())


def test_slurm_gres_id_is_slurms_byte_sum() -> None:
    # gres_build_id("gpu") = 'g' + ('p' << 8) + ('u' << 16): 7696487, GPU's plugin id in Slurm
    assert slurm_gres_id("gpu") == 103 + (112 << 8) + (117 << 16) == 7696487
    assert slurm_gres_id("") == 0
    assert slurm_gres_id("abcde") == 97 + (98 << 8) + (99 << 16) + (100 << 24) + 101
    big = "z" * 4000  # wraps modulo 2**32 like the C uint32_t
    assert 0 <= slurm_gres_id(big) < 2**32


def test_check_types_refuses_types_that_slurm_would_confuse() -> None:
    # bytes 4 positions apart have the same shift: swapping them keeps Slurm's id
    a = "GPU-12345678-aaaa-bbbb-cccc-000000000000"
    b = "GPU-52341678-aaaa-bbbb-cccc-000000000000"
    assert gres_type(a) != gres_type(b)
    assert slurm_gres_id(gres_type(a)) == slurm_gres_id(gres_type(b))
    with pytest.raises(GresError, match="same Slurm id"):
        check_types([a, b])
    with pytest.raises(GresError, match="letter case"):
        check_types(["GPU-abc", "GPU-ABC"])
    with pytest.raises(GresError, match="listed twice"):
        check_types([a, a])
    assert check_types([a, N2_A]) == {a: gres_type(a), N2_A: gres_type(N2_A)}


def test_gres_conf_and_node_gres_of_a_cluster_node() -> None:
    node = load_topology_file(NODE2)
    files = {N2_A: "/d/nvidia2", N2_B: "/d/nvidia3"}
    assert gres_conf(node, files) == [
        f"NodeName=node2 Name=gpu Type={gres_type(N2_A)} File=/d/nvidia2 Cores=0",
        f"NodeName=node2 Name=gpu Type={gres_type(N2_B)} File=/d/nvidia3 Cores=1",
    ]
    assert node_gres(node) == f"gpu:{gres_type(N2_A)}:1,gpu:{gres_type(N2_B)}:1"


def test_gres_conf_cores_follow_the_numa_node_and_index_order() -> None:
    node = node_from_dict({
        "name": "big",
        "numa_nodes": [{"id": 0, "cpus": "0-3,8-11", "memory": "1G"},
                       {"id": 1, "cpus": "4-7", "memory": "1G"}],
        "gpus": [{"uuid": "GPU-b", "index": 1, "numa_node": 0},
                 {"uuid": "GPU-a", "index": 0, "numa_node": 1},
                 {"uuid": "GPU-c", "index": 2, "numa_node": None}],
    })
    lines = gres_conf(node, {"GPU-a": "/dev/nvidia0", "GPU-b": "/dev/nvidia1",
                             "GPU-c": "/dev/nvidia2"})
    assert lines == [
        "NodeName=big Name=gpu Type=gpu-a File=/dev/nvidia0 Cores=4-7",
        "NodeName=big Name=gpu Type=gpu-b File=/dev/nvidia1 Cores=0-3,8-11",
        "NodeName=big Name=gpu Type=gpu-c File=/dev/nvidia2",  # NUMA node unknown: any core
    ]
    assert node_gres(node) == "gpu:gpu-a:1,gpu:gpu-b:1,gpu:gpu-c:1"


def test_gres_conf_refuses_missing_or_bad_device_files() -> None:
    node = load_topology_file(NODE2)
    with pytest.raises(GresError, match=f"{N2_B} has no device file"):
        gres_conf(node, {N2_A: "/d/nvidia2"})
    with pytest.raises(GresError, match="absolute path"):
        gres_conf(node, {N2_A: "d/nvidia2", N2_B: "/d/nvidia3"})
    with pytest.raises(GresError, match="absolute path"):
        gres_conf(node, {N2_A: "/d/nv 2", N2_B: "/d/nvidia3"})


def test_a_node_without_gpus_has_no_gres() -> None:
    node = load_topology_file(REPO / "tests" / "data" / "topologies" / "cpu-only.yaml")
    assert gres_conf(node, {}) == []
    assert node_gres(node) == ""


def test_cli_slurm_gres_prints_gres_conf_and_each_nodes_gres(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["slurm-gres", "--topology", str(NODE1), "--topology", str(NODE2),
                 "--dev-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    body = [ln for ln in out if not ln.startswith("#")]
    assert body[0] == "AutoDetect=off"
    assert body[1:] == [
        f"NodeName=node1 Name=gpu Type=gpu-5a0c1e7b-3f4d-4b8e-9c21-6d0e8f1a2b30 "
        f"File={tmp_path}/nvidia0 Cores=0",
        f"NodeName=node1 Name=gpu Type={T_N1_B} File={tmp_path}/nvidia1 Cores=1",
        f"NodeName=node2 Name=gpu Type={gres_type(N2_A)} File={tmp_path}/nvidia2 Cores=0",
        f"NodeName=node2 Name=gpu Type={gres_type(N2_B)} File={tmp_path}/nvidia3 Cores=1",
    ]
    gres = {m.group(1): m.group(2) for ln in out
            if (m := re.match(r"# slurm.conf NodeName=(\S+) Gres=(\S+)$", ln))}
    assert gres == {"node1": node_gres(load_topology_file(NODE1)),
                    "node2": node_gres(load_topology_file(NODE2))}


def test_cli_slurm_gres_index_numbering_and_output_file(tmp_path: Path) -> None:
    out = tmp_path / "gres.conf"
    assert main(["slurm-gres", "--topology", str(NODE2), "--dev-dir", "/dev",
                 "--numbering", "index", "-o", str(out)]) == 0
    lines = [ln for ln in out.read_text().splitlines() if ln.startswith("NodeName=")]
    assert [ln.split("File=")[1].split()[0] for ln in lines] == ["/dev/nvidia0", "/dev/nvidia1"]


def test_cli_slurm_gres_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["slurm-gres", "--topology", str(NODE1), "--topology", str(NODE1),
                 "--dev-dir", str(tmp_path)]) == 1
    assert "given twice: node1" in capsys.readouterr().err
    assert main(["slurm-gres", "--topology", str(tmp_path / "nope.yaml"),
                 "--dev-dir", str(tmp_path)]) == 1
    assert "file not found" in capsys.readouterr().err
    assert main(["slurm-gres", "--dev-dir", str(tmp_path)]) == 2  # no topology at all
    assert "give --topology or --model-topology" in capsys.readouterr().err


def test_cli_slurm_gres_model_topology(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    """--model-topology: that node's GPUs get their model as Type (one count per model in
    Gres=), numbered after the per-GPU-typed nodes; a model that is no valid Type is refused."""
    node3 = NODE1.parent / "node3.yaml"
    assert main(["slurm-gres", "--topology", str(NODE1), "--model-topology", str(node3),
                 "--dev-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"NodeName=node3 Name=gpu Type=FAKE File={tmp_path}/nvidia2 Cores=0" in out
    assert f"NodeName=node3 Name=gpu Type=FAKE File={tmp_path}/nvidia3 Cores=1" in out
    assert "# slurm.conf NodeName=node3 Gres=gpu:FAKE:2" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(node3.read_text().replace("model: FAKE", "model: 9x"))
    assert main(["slurm-gres", "--model-topology", str(bad), "--dev-dir", str(tmp_path)]) == 1
    assert "model '9x' is no valid GRES Type" in capsys.readouterr().err


# --------------------------------------------------------------------------- syntax helpers


def test_expand_hostlist() -> None:
    assert expand_hostlist("node1") == ("node1",)
    assert expand_hostlist("node[1-3,5],gpu07") == ("node1", "node2", "node3", "node5", "gpu07")
    assert expand_hostlist("n[08-10]x") == ("n08x", "n09x", "n10x")
    assert expand_hostlist("") == () and expand_hostlist("(null)") == ()
    for bad in ("node[1-", "node[a-b]", "node]1", "node[1]x[2]"):
        with pytest.raises(ValueError):
            expand_hostlist(bad)


def test_expand_cpu_ids() -> None:
    assert expand_cpu_ids("0-1,3") == (0, 1, 3)
    assert expand_cpu_ids("1") == (1,)
    with pytest.raises(ValueError):
        expand_cpu_ids("x")


def test_parse_gres_detail() -> None:
    assert parse_gres_detail(f"gpu:{T_N1_B}:1(IDX:1)") == (GresAlloc("gpu", T_N1_B, 1, (1,)),)
    assert parse_gres_detail("gpu:a:1(IDX:0),gpu:b:3(IDX:2-3,5)") == (
        GresAlloc("gpu", "a", 1, (0,)), GresAlloc("gpu", "b", 3, (2, 3, 5)))
    assert parse_gres_detail("gpu:2(IDX:0-1)") == (GresAlloc("gpu", "", 2, (0, 1)),)
    assert parse_gres_detail("gpu:tesla") == (GresAlloc("gpu", "tesla", 1, ()),)
    assert parse_gres_detail("bandwidth:20(CNT:20)") == (GresAlloc("bandwidth", "", 20, ()),)
    assert parse_gres_detail("") == ()
    for bad in ("gpu:a:b:c", "gpu:a:x", "gpu(IDX:0)gpu", ":1"):
        with pytest.raises(ValueError):
            parse_gres_detail(bad)


def test_parse_key_values_keeps_spaces_where_scontrol_prints_them() -> None:
    kv = parse_key_values("NodeName=n1 Arch=x86_64\n   OS=Linux 6.1 #1 SMP\n"
                          "   State=IDLE+DRAIN Weight=1\n"
                          "   Reason=gpu xid=79 [root@2026-01-01T00:00:00]")
    assert kv["OS"] == "Linux 6.1 #1 SMP"
    assert kv["State"] == "IDLE+DRAIN" and kv["Weight"] == "1"
    assert kv["Reason"] == "gpu xid=79 [root@2026-01-01T00:00:00]"


def test_parse_key_values_a_jobs_features_share_their_line() -> None:
    # scontrol show job (22.05) prints "Features=node2 DelayBoot=00:00:00" on one line; a
    # node's AvailableFeatures/ActiveFeatures have lines of their own
    kv = parse_key_values("JobId=7 JobName=x\n   Features=node2 DelayBoot=00:00:00\n"
                          "   AvailableFeatures=a b\n")
    assert kv["Features"] == "node2" and kv["DelayBoot"] == "00:00:00"
    assert kv["AvailableFeatures"] == "a b"


# --------------------------------------------------------------------------- scontrol show job


def test_parse_running_job_with_one_gpu() -> None:
    job = parse_job(fixture_text("job_running_gres.txt"))
    assert (job.job_id, job.name, job.state, job.reason) == (1, "probe", "RUNNING", "None")
    assert (job.user, job.uid) == ("gpsuser1", 2001)
    assert job.node_list == ("node1",)
    assert job.comment == "hello world"
    assert len(job.details) == 1
    d = job.details[0]
    assert d.nodes == ("node1",) and d.cpu_ids == (1,) and d.memory_mb == 100
    assert d.gres == (GresAlloc("gpu", T_N1_B, 1, (1,)),)
    assert job.gres_indices("node1") == {T_N1_B: (1,)}
    assert job.gres_indices("node2") == {} and job.node_detail("node2") is None
    assert job.fields["WorkDir"] == "/tmp/sj"
    assert job.fields["TresPerNode"] == f"gres:gpu:{T_N1_B}:1"


def test_parse_running_job_with_two_gpus() -> None:
    job = parse_job(fixture_text("job_two_gpus.txt"))
    assert job.state == "RUNNING" and job.node_list == ("node2",)
    d = job.node_detail("node2")
    assert d is not None and d.cpu_ids == (0, 1) and d.memory_mb == 200
    assert job.gres_indices("node2") == {gres_type(N2_A): (0,), gres_type(N2_B): (1,)}
    assert job.comment == ""  # (null)


def test_parse_job_on_two_nodes() -> None:
    job = parse_job(fixture_text("job_two_nodes.txt"))
    assert job.node_list == ("node1", "node2")  # NodeList=node[1-2]
    assert [d.nodes for d in job.details] == [("node1",), ("node2",)]
    assert all(d.cpu_ids == (0, 1) and d.memory_mb == 50 for d in job.details)
    assert job.gres_indices("node1") == {
        "gpu-5a0c1e7b-3f4d-4b8e-9c21-6d0e8f1a2b30": (0,), T_N1_B: (1,)}
    assert job.gres_indices("node2") == {gres_type(N2_A): (0,), gres_type(N2_B): (1,)}


def test_parse_pending_and_cancelled_jobs() -> None:
    pending = parse_job(fixture_text("job_pending.txt"))
    assert (pending.state, pending.reason, pending.node_list, pending.details) == \
        ("PENDING", "Resources", (), ())
    cancelled = parse_job(fixture_text("job_cancelled.txt"))
    assert cancelled.state == "CANCELLED"
    # the detail line stays, its GRES is emptied once the job ended
    assert cancelled.details[0].cpu_ids == (0, 1) and cancelled.details[0].gres == ()
    assert cancelled.gres_indices("node2") == {}


def test_parse_all_jobs() -> None:
    jobs = parse_jobs(fixture_text("jobs_all.txt"))
    assert [(j.job_id, j.state, j.reason) for j in jobs] == [
        (1, "RUNNING", "None"), (2, "FAILED", "BadConstraints"), (3, "PENDING", "Resources")]
    assert jobs[0].gres_indices("node1") == {T_N1_B: (1,)}
    with pytest.raises(ValueError, match="expected one job record, found 3"):
        parse_job(fixture_text("jobs_all.txt"))
    with pytest.raises(ValueError, match="found 0"):
        parse_job("slurm_load_jobs error: Invalid job id specified\n")


# --------------------------------------------------------------------------- scontrol show node


def test_parse_nodes_busy_cluster() -> None:
    nodes = {n.name: n for n in parse_nodes(fixture_text("nodes_busy.txt"))}
    assert set(nodes) == {"node1", "node2"}
    n1, n2 = nodes["node1"], nodes["node2"]
    assert (n1.state, n1.flags, n1.cpus, n1.real_memory_mb) == ("MIXED", frozenset(), 2, 4000)
    assert n1.gres == (f"gpu:gpu-5a0c1e7b-3f4d-4b8e-9c21-6d0e8f1a2b30:1(S:0),"
                       f"gpu:{T_N1_B}:1(S:1)")
    assert n1.usable and n2.usable and n2.state == "IDLE" and n1.reason == ""
    assert n1.fields["OS"].startswith("Linux ")


def test_parse_drained_and_draining_nodes() -> None:
    (draining,) = parse_nodes(fixture_text("node_draining.txt"))
    assert (draining.state, draining.flags) == ("ALLOCATED", frozenset({"DRAIN"}))
    assert draining.reason == "xid 79 on GPU-1f8d4c63"
    assert draining.fields["Reason"] == "xid 79 on GPU-1f8d4c63 [root@2026-11-23T13:16:03]"
    assert draining.drained and draining.responding and not draining.usable
    nodes = {n.name: n for n in parse_nodes(fixture_text("nodes_drained.txt"))}
    assert nodes["node2"].state == "IDLE" and nodes["node2"].drained
    assert nodes["node1"].usable and not nodes["node1"].drained


def test_parse_nodes_that_stopped_responding() -> None:
    (nr,) = parse_nodes(fixture_text("node_not_responding.txt"))
    assert (nr.state, nr.flags) == ("IDLE", frozenset({"NOT_RESPONDING"}))
    assert not nr.responding and not nr.usable and not nr.drained
    (down,) = parse_nodes(fixture_text("node_down.txt"))
    assert (down.state, down.flags) == ("DOWN", frozenset({"NOT_RESPONDING"}))
    assert down.reason == "Not responding" and not down.usable


def test_parse_node_state_forms() -> None:
    assert parse_node_state("IDLE") == ("IDLE", frozenset())
    assert parse_node_state("IDLE*") == ("IDLE", frozenset({"NOT_RESPONDING"}))
    assert parse_node_state("DOWN*+DRAIN+NOT_RESPONDING") == \
        ("DOWN", frozenset({"DRAIN", "NOT_RESPONDING"}))
    assert parse_node_state("") == ("", frozenset())


# --------------------------------------------------------------------------- the client


def fake_bin(tmp_path: Path, name: str, body: str) -> Path:
    """A stand-in for a Slurm command: a shell script in tmp_path/bin."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bindir


def test_client_sbatch_passes_options_script_and_conf(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    bindir = fake_bin(tmp_path, "sbatch",
                      f'printf "%s\\n" "$@" > {rec}.args\necho "$SLURM_CONF" > {rec}.conf\n'
                      f'cat > {rec}.stdin\necho "42;gpuspawner"\n')
    client = SlurmClient(conf="/x/slurm.conf", bin_dir=str(bindir))
    job_id = asyncio.run(client.sbatch("#!/bin/sh\ntrue\n", ["--gres=gpu:t:1", "-J", "a b"],
                                       user="gpsuser1"))
    assert job_id == 42
    assert Path(f"{rec}.args").read_text().splitlines() == [
        "--parsable", "--gres=gpu:t:1", "-J", "a b", "--uid=gpsuser1", "--gid=gpsuser1"]
    assert Path(f"{rec}.conf").read_text() == "/x/slurm.conf\n"
    assert Path(f"{rec}.stdin").read_text() == "#!/bin/sh\ntrue\n"


def test_client_errors_carry_command_exit_code_and_stderr(tmp_path: Path) -> None:
    bindir = fake_bin(tmp_path, "sbatch",
                      "echo 'sbatch: error: Invalid generic resource (gres) specification' >&2\n"
                      "exit 1\n")
    client = SlurmClient(bin_dir=str(bindir))
    with pytest.raises(SlurmError) as e:
        asyncio.run(client.sbatch("#!/bin/sh\n", ["--gres=gpu:x:y"]))
    assert e.value.returncode == 1
    assert e.value.stderr == "sbatch: error: Invalid generic resource (gres) specification"
    assert e.value.command[0].endswith("/sbatch") and "--gres=gpu:x:y" in e.value.command
    fake_bin(tmp_path, "sbatch", "echo 'Submitted batch job 7'\n")
    with pytest.raises(ValueError, match="not a job id"):
        asyncio.run(client.sbatch("#!/bin/sh\n"))


def test_client_kills_a_command_past_its_timeout(tmp_path: Path) -> None:
    bindir = fake_bin(tmp_path, "squeue", "exec sleep 30\n")
    client = SlurmClient(bin_dir=str(bindir), timeout=0.5)
    start = time.monotonic()
    with pytest.raises(SlurmError, match=r"timed out after 0\.5 s") as e:
        asyncio.run(client.squeue())
    assert e.value.returncode is None
    assert time.monotonic() - start < 10


def test_client_missing_command(tmp_path: Path) -> None:
    client = SlurmClient(bin_dir=str(tmp_path / "nowhere"))
    with pytest.raises(SlurmError, match="cannot run") as e:
        asyncio.run(client.scancel(5))
    assert e.value.returncode is None


def test_client_squeue_show_job_and_unknown_jobs(tmp_path: Path) -> None:
    bindir = fake_bin(tmp_path, "squeue",
                      'case "$*" in *--jobs=99*) echo "slurm_load_jobs error: Invalid job id '
                      'specified" >&2; exit 1;; esac\nprintf "5 RUNNING\\n6 PENDING\\n"\n')
    fake_bin(tmp_path, "scontrol",
             f'[ "$4" = 99 ] && {{ echo "slurm_load_jobs error: Invalid job id specified" >&2; '
             f'exit 1; }}\n[ "$2" = node ] && {{ cat {DATA}/nodes_busy.txt; exit 0; }}\n'
             f'cat {DATA}/job_running_gres.txt\n')
    client = SlurmClient(bin_dir=str(bindir))
    assert asyncio.run(client.squeue()) == {5: "RUNNING", 6: "PENDING"}
    assert asyncio.run(client.squeue([99])) == {}
    job = asyncio.run(client.show_job(1))
    assert job is not None and job.gres_indices("node1") == {T_N1_B: (1,)}
    assert asyncio.run(client.show_job(99)) is None
    assert [n.name for n in asyncio.run(client.show_nodes())] == ["node1", "node2"]



def test_the_slurm_commands_umask_follows_who_reads_the_job_output(monkeypatch) -> None:
    """A root hub reads a job's output file as the job's user, so the jobs get umask 077 (the
    file is the user's alone); a hub running as SlurmUser reads it itself, so its commands
    keep its own umask (-1: subprocess leaves it unchanged); an explicit one wins."""
    from gpuspawner.backends.slurm import commands

    monkeypatch.setattr(commands.os, "geteuid", lambda: 0)
    assert commands.SlurmClient().umask == 0o077
    monkeypatch.setattr(commands.os, "geteuid", lambda: 64030)
    assert commands.SlurmClient().umask == -1
    assert commands.SlurmClient(umask=0o027).umask == 0o027
