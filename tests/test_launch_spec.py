"""The pure path allocation -> LaunchSpec -> Docker create arguments, without an engine."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("docker")

from gpuspawner.backends.docker import (  # noqa: E402
    CERTS_MOUNT,
    DiskLimitUnsupported,
    container_config,
    disk_rule,
)
from gpuspawner.backends.spec import ALLOCATION_LABEL, HomeMount, launch_spec  # noqa: E402
from gpuspawner.placement import Allocation, GPUShare, Owner  # noqa: E402

MiB = 2**20


def alloc(gpus=("GPU-aaaa", "GPU-bbbb"), cpus=(8, 9, 10, 11), mems=(1,)) -> Allocation:
    return Allocation(id="a1", owner=Owner("ann", "work"), node="n1",
                      gpus=tuple(GPUShare(u) for u in gpus), cpuset=cpus, mems=mems,
                      memory_bytes=512 * MiB, disk_bytes=0,
                      memory_by_numa=((mems[0], 512 * MiB),), created=time.time())


def spec(**kw):
    args = dict(name="jupyter-ann--work", user="ann", server="work", allocation=alloc(),
                image="img:1", cmd=["jupyterhub-singleuser"], env={"JUPYTERHUB_USER": "ann"},
                uid=1001, gid=100, port=8888)
    args.update(kw)
    return launch_spec(**args)


def test_spec_carries_allocation_env_labels_and_home():
    s = spec(home=HomeMount("/shared/home/ann", "/home/ann"))
    assert s.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert s.env["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa,GPU-bbbb"
    assert s.env["OMP_NUM_THREADS"] == s.env["CPU_LIMIT"] == "4"
    assert s.env["MEM_LIMIT"] == str(512 * MiB)
    assert s.env["HOME"] == s.working_dir == "/home/ann"
    assert s.env["JUPYTERHUB_USER"] == "ann"
    assert json.loads(s.labels[ALLOCATION_LABEL])["id"] == "a1"
    assert s.labels["gpuspawner.server"] == "work"
    cpu_only = spec(allocation=alloc(gpus=()))
    assert cpu_only.env["NVIDIA_VISIBLE_DEVICES"] == "void"


@pytest.mark.parametrize("kw, message", [
    ({"uid": -1}, "uid/gid"), ({"port": 0}, "port"), ({"cmd": []}, "command is empty")])
def test_spec_refuses_nonsense(kw, message):
    with pytest.raises(ValueError, match=message):
        spec(**kw)


def test_container_config_pins_and_hardens():
    s = spec(home=HomeMount("/shared/home/ann", "/home/ann"), certs_dir="/var/certs/x")
    create, host = container_config(
        s, network="jupyter-ann--work-net", fixed_ip="198.18.0.18", pids_limit=512,
        storage_opt={"size": "1000"},
        base_host={"security_opt": ["apparmor=docker-default"], "privileged": True,
                   "binds": {"/data": {"bind": "/data", "mode": "ro"}}},
        base_create={"labels": {"site": "x"}, "hostname": "h"})
    assert host["cpuset_cpus"] == "8-11" and host["cpuset_mems"] == "1"
    assert host["mem_limit"] == host["memswap_limit"] == 512 * MiB
    assert host["privileged"] is False  # the admin's True does not win
    assert host["security_opt"] == ["apparmor=docker-default", "no-new-privileges"]
    assert host["pids_limit"] == 512 and host["auto_remove"] is False
    assert host["network_mode"] == "jupyter-ann--work-net"
    assert host["storage_opt"] == {"size": "1000"}
    (req,) = host["device_requests"]
    assert req["Driver"] == "nvidia" and req["DeviceIDs"] == ["GPU-aaaa", "GPU-bbbb"]
    assert host["binds"]["/shared/home/ann"] == {"bind": "/home/ann", "mode": "rw"}
    assert host["binds"]["/var/certs/x"] == {"bind": CERTS_MOUNT, "mode": "ro"}
    assert host["binds"]["/data"]["mode"] == "ro"
    assert create["user"] == "1001:100" and create["working_dir"] == "/home/ann"
    assert create["labels"]["site"] == "x" and create["labels"]["gpuspawner.user"] == "ann"
    assert create["hostname"] == "h" and create["name"] == "jupyter-ann--work"
    assert create["networking_config"]["EndpointsConfig"]["jupyter-ann--work-net"] == {
        "IPAMConfig": {"IPv4Address": "198.18.0.18"}}


def test_container_config_refuses_the_docker_socket():
    with pytest.raises(ValueError, match="Docker socket"):
        container_config(spec(), base_host={"binds": {"/var/run/docker.sock": {
            "bind": "/var/run/docker.sock", "mode": "rw"}}})


def test_disk_rules():
    assert disk_rule(0, supported=False, driver="overlay2", image_bytes=0, mode="refuse") \
        == ({}, "")
    opt, msg = disk_rule(64 * MiB, supported=True, driver="btrfs", image_bytes=10 * MiB,
                         mode="account")
    assert opt == {"size": str(74 * MiB)} and "64.0 MiB writable (btrfs" in msg
    opt, _ = disk_rule(64 * MiB, supported=True, driver="overlay2", image_bytes=10 * MiB,
                       mode="account")
    assert opt == {"size": str(64 * MiB)}  # overlay2+xfs pquota counts only the layer
    opt, msg = disk_rule(64 * MiB, supported=False, driver="overlay2", image_bytes=0,
                         mode="account")
    assert opt == {} and "accounted only" in msg
    with pytest.raises(DiskLimitUnsupported, match="overlay2 cannot limit disk"):
        disk_rule(64 * MiB, supported=False, driver="overlay2", image_bytes=0, mode="refuse")


def test_mig_instances_go_to_the_container_by_uuid():
    from dataclasses import replace

    from gpuspawner.placement import MigShare

    mig = (MigShare("MIG-1111", "GPU-aaaa", "1g.10gb", 1),
           MigShare("MIG-2222", "GPU-aaaa", "2g.20gb", 2))
    s = spec(allocation=replace(alloc(gpus=()), mig=mig))
    assert s.env["NVIDIA_VISIBLE_DEVICES"] == "MIG-1111,MIG-2222"
    assert json.loads(s.labels[ALLOCATION_LABEL])["mig"][0]["uuid"] == "MIG-1111"
    _create, host = container_config(s)
    (req,) = host["device_requests"]
    assert req["Driver"] == "nvidia" and req["DeviceIDs"] == ["MIG-1111", "MIG-2222"]
    assert "gpu" in req["Capabilities"][0]  # the same capabilities as a whole GPU
