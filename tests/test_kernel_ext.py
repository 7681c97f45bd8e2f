"""``%load_ext gpuspawner.kernel`` in a REAL ipykernel (jupyter_client's KernelManager), with
the NVML double injected through ``GPUSPAWNER_NVML_FACTORY``: the widget models the kernel
opens carry the expected values, and they are updated while a cell runs."""

from __future__ import annotations

import json
import os
import queue
import sys
import time
from pathlib import Path

import pytest
from jupyter_client import KernelManager

ROOT = Path(__file__).resolve().parents[1]
GiB = 1024**3


def start_kernel(factory: str):
    env = dict(os.environ)
    env["GPUSPAWNER_NVML_FACTORY"] = factory
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("GPUSPAWNER_ALLOCATION", None)
    km = KernelManager(kernel_name="python3")
    km.kernel_spec.argv[0] = sys.executable  # the venv's python, which has ipykernel
    km.start_kernel(env=env, cwd=str(ROOT))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc


def run(kc, code: str, timeout: float = 30) -> tuple[list[dict], str]:
    """Execute ``code``; return every IOPub message of that execution and its stdout."""
    msg_id = kc.execute(code)
    msgs, out = [], ""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            m = kc.get_iopub_msg(timeout=max(0.1, deadline - time.time()))
        except queue.Empty:
            break
        msgs.append(m)
        if m["msg_type"] == "stream" and m["parent_header"].get("msg_id") == msg_id:
            out += m["content"]["text"]
        if m["msg_type"] == "error":
            raise AssertionError("\n".join(m["content"]["traceback"]))
        if (m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
                and m["parent_header"].get("msg_id") == msg_id):
            break
    else:
        raise AssertionError(f"no idle after {timeout}s for {code!r}")
    reply = kc.get_shell_msg(timeout=10)
    assert reply["content"]["status"] == "ok", reply["content"]
    return msgs, out


@pytest.fixture
def kernel(request):
    km, kc = start_kernel(request.param)
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


STATE = "import gpuspawner.kernel as gk, json; print(json.dumps(gk.widget_state()))"


@pytest.mark.parametrize("kernel", ["tests.test_gpuviews_nvml:metrics_double"], indirect=True)
def test_load_ext_shows_monitor_with_values(kernel):
    msgs, _ = run(kernel, "%load_ext gpuspawner.kernel")
    opens = [m for m in msgs if m["msg_type"] == "comm_open"
             and m["content"].get("target_name") == "jupyter.widget"]
    models = {m["content"]["comm_id"]: dict(m["content"]["data"]["state"]) for m in opens}
    for m in msgs:  # what a front end holds: the opened state plus every update, in order
        if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] in models \
                and m["content"]["data"].get("method") == "update":
            models[m["content"]["comm_id"]].update(m["content"]["data"]["state"])
    progress = [s for s in models.values() if s["_model_name"] == "FloatProgressModel"]
    displays = [m for m in msgs if m["msg_type"] == "display_data"]
    assert displays, "the monitor was not displayed"
    view = displays[0]["content"]["data"]["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] in models
    # two GPUs: util 37 / 80 %, memory 10 / 20 GiB of 80 GiB (from the double)
    utils = sorted(s["value"] for s in progress if s["description"] == "util")
    mems = sorted(s["value"] for s in progress if s["description"] == "memory")
    assert utils == [37.0, 80.0]
    assert mems == [10.0 * GiB, 20.0 * GiB]
    assert all(s["max"] == 80.0 * GiB for s in progress if s["description"] == "memory")

    _, out = run(kernel, STATE)
    st = json.loads(out)
    assert "2 GPU(s)" in st["header"]
    assert [g["utilization"] for g in st["gpus"]] == [37.0, 80.0]
    assert st["gpus"][1]["memory_text"] == "20.0 GiB / 80.0 GiB"
    assert "util" in st["gpus"][0]["history"]

    # values move while a cell runs (the update thread sends comm messages during sleep)
    run(kernel, "gk.monitor().sampler._nvml.util[0] = 95")
    msgs, _ = run(kernel, "import time; time.sleep(3)")
    util0 = st["gpus"][0]["utilization_model_id"]
    updates = [m["content"]["data"]["state"] for m in msgs if m["msg_type"] == "comm_msg"
               and m["content"]["comm_id"] == util0
               and m["content"]["data"].get("method") == "update"]
    assert {"value": 95.0} in [{k: v for k, v in u.items() if k == "value"} for u in updates]

    # %reload_ext stops the old monitor and shows a new one (a fresh double: 37 % again)
    run(kernel, "old = gk.monitor()")
    msgs, _ = run(kernel, "%reload_ext gpuspawner.kernel")
    assert [m for m in msgs if m["msg_type"] == "display_data"]
    _, out = run(kernel, STATE)
    assert json.loads(out)["gpus"][0]["utilization"] == 37.0
    _, out = run(kernel, "print(old._thread is None, gk.monitor() is not old)")
    assert out.split() == ["True", "True"]


@pytest.mark.parametrize("kernel", ["tests.test_gpuviews_nvml:no_nvml_double"], indirect=True)
def test_no_gpu_state(kernel):
    run(kernel, "%load_ext gpuspawner.kernel")
    _, out = run(kernel, STATE)
    st = json.loads(out)
    assert "no NVML" in st["header"] and st["gpus"] == []


@pytest.mark.parametrize("kernel", ["tests.test_gpuviews_nvml:mig_double"], indirect=True)
def test_mig_shows_na(kernel):
    run(kernel, "%load_ext gpuspawner.kernel")
    _, out = run(kernel, STATE)
    st = json.loads(out)
    assert [g["utilization_text"] for g in st["gpus"]] == [
        "n/a (MIG: NVML gives no utilisation)"] * 2
    assert st["gpus"][0]["memory"] == 1.0 * GiB


@pytest.mark.parametrize("kernel", ["tests.test_gpuviews_nvml:metrics_double"], indirect=True)
def test_unload_stops(kernel):
    run(kernel, "%load_ext gpuspawner.kernel")
    run(kernel, "%unload_ext gpuspawner.kernel")
    _, out = run(kernel, STATE)
    assert json.loads(out) is None
