"""The PyTorch image (images/pytorch, scripts/build-pytorch-image.sh) on this machine, which has
no GPU (marked ``docker``).

A container as an arbitrary uid with no network shows that ``import torch`` works, that the
build is a CUDA build, and that ``gpuspawner-torch-check`` says in one line that no CUDA device
is visible (exit code 2). A real IPython kernel in the image, with the share's memory limit in
its environment, loads gpuspawner.singleuser.torchshare without importing torch, and the
notebook's own ``import torch`` queues the memory fraction with real torch's ``_lazy_call``
(run here by hand with the device calls stubbed: there is no GPU to initialise).
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

from tests.test_images import DEPS_IMAGE, assert_stage_below, docker, engine_info, image_config

pytestmark = pytest.mark.docker

IMAGE = os.environ.get("GPUSPAWNER_PYTORCH_IMAGE", "gpuspawner/pytorch:latest")
GiB = 1024**3


@pytest.fixture(scope="module")
def image() -> str:
    if engine_info() is None:
        pytest.skip("no Docker engine answers `docker info`; start one with `make engine`")
    if docker("image", "inspect", IMAGE, check=False).returncode != 0:
        pytest.skip(f"image {IMAGE} missing; build it with `make pytorch-image`")
    return IMAGE


def run(image: str, *cmd: str, env: dict[str, str] | None = None, check: bool = True):
    name = f"gpuspawner-test-{uuid.uuid4().hex[:10]}"
    opts = ["--user", "12345:12345", "--network", "none", "-e", "HOME=/tmp"]
    for k, v in (env or {}).items():
        opts += ["-e", f"{k}={v}"]
    try:
        return docker("run", "--rm", "--name", name, *opts, image, *cmd, timeout=300,
                      check=check)
    finally:
        docker("rm", "-f", name, check=False)


def test_torch_imports_and_the_check_says_no_cuda_device(image):
    proc = run(image, "gpuspawner-torch-check", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    lines = out.strip().splitlines()
    assert lines[0].startswith("torch 2.14.1"), out
    assert "CUDA build: none" not in lines[0], out  # the CUDA build, not the CPU one
    assert lines[1].startswith("no CUDA device visible: torch.cuda.is_available() is False"), out
    assert "start it with a GPU profile" in lines[1]


KERNEL_DRIVER = r"""
import json
from jupyter_client.manager import start_new_kernel

km, kc = start_new_kernel(kernel_name="python3", startup_timeout=120)
def run(code):
    out = []
    def hook(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("ERROR " + msg["content"]["ename"] + ": " + msg["content"]["evalue"])
    kc.execute_interactive(code, output_hook=hook, timeout=240)
    return "".join(out).strip()
res = {}
res["at_start"] = run("import sys, json; print(json.dumps(['torch' in sys.modules, "
                      "'gpuspawner.singleuser.torchshare' in sys.modules]))")
res["after_import"] = run(
    "import torch\n"
    "calls = [c[0] for c in torch.cuda._queued_calls\n"
    "         if c[0].__module__ == 'gpuspawner.singleuser.torchshare']\n"
    "print(json.dumps([torch.cuda.is_initialized(), len(calls)]))")
res["applied"] = run(
    "import types\n"
    "from gpuspawner.singleuser import torchshare\n"
    "seen = {}\n"
    "torch.cuda.device_count = lambda: 1\n"
    "torch.cuda.get_device_properties = lambda d: types.SimpleNamespace(total_memory=80 * 2**30)\n"
    "torch.cuda.set_per_process_memory_fraction = lambda f, d: seen.__setitem__(d, f)\n"
    "for c in calls: c()\n"
    "print(json.dumps([seen, torchshare.applied]))")
kc.stop_channels(); km.shutdown_kernel(now=True)
print("RESULT " + json.dumps(res))
"""


def kernel_results(image: str, env: dict[str, str]) -> dict:
    proc = run(image, "python", "-c", KERNEL_DRIVER, env=env)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, proc.stdout + proc.stderr
    return {k: json.loads(v) if v.startswith(("[", "{")) else v
            for k, v in json.loads(line[-1][7:]).items()}


def test_kernel_sets_the_share_fraction_lazily(image):
    res = kernel_results(image, {"GPUSPAWNER_GPU_MEMORY_LIMIT": str(20 * GiB)})
    # the extension is loaded at kernel start, torch is not imported by it
    assert res["at_start"] == [False, True], res
    # the notebook's import queues one call of ours (torch queues its own checks too) and
    # initialises no CUDA
    assert res["after_import"] == [False, 1], res
    # at CUDA init (the queued call): 20 GiB of an 80 GiB device
    assert res["applied"] == [{"0": 0.25}, {"0": 0.25}], res


def test_kernel_without_a_share_queues_nothing(image):
    res = kernel_results(image, {})
    assert res["at_start"] == [False, True], res
    assert res["after_import"] == [False, 0], res
    assert res["applied"] == [{}, {}], res


def test_binder_example_trains_on_the_cpu_with_a_note(image):
    """binder/pytorch-train.ipynb, run by papermill in the image: no GPU here, so it says so
    and trains on the CPU; the loss falls."""
    binder = os.path.join(os.path.dirname(os.path.dirname(__file__)), "binder")
    name = f"gpuspawner-test-{uuid.uuid4().hex[:10]}"
    script = (
        "papermill -k python3 --no-progress-bar /nb/pytorch-train.ipynb /tmp/out.ipynb >/dev/null"
        " && python -c \"import nbformat; nb = nbformat.read('/tmp/out.ipynb', 4); "
        "print(''.join(o.get('text', '') for c in nb.cells if c.cell_type == 'code' "
        "for o in c.outputs))\""
    )
    try:
        proc = docker("run", "--rm", "--name", name, "--user", "12345:12345", "--network", "none",
                      "-e", "HOME=/tmp", "-v", f"{binder}:/nb:ro", image, "sh", "-c", script,
                      timeout=300)
    finally:
        docker("rm", "-f", name, check=False)
    out = proc.stdout
    assert "no GPU visible (torch.cuda.is_available() is False): training on the CPU" in out, out
    line = next(ln for ln in out.splitlines() if ln.startswith("300 steps on cpu"))
    first, last = (float(v) for v in line.split("loss ")[1].split(" -> "))
    assert last < first / 5, line
    assert "no GPU memory used" in out


def test_torch_layer_sits_on_the_deps_stage_below_the_project(image):
    """The torch layer (gpuspawner/pytorch:torch-layer) is built on the single-user image's deps
    stage and kept; gpuspawner/pytorch:latest is that layer plus a project-sized top, so a
    change to the project's code does not reinstall torch."""
    layer = "gpuspawner/pytorch:torch-layer"
    for needed in (DEPS_IMAGE, layer):
        if docker("image", "inspect", needed, check=False).returncode != 0:
            raise AssertionError(f"{image} exists but {needed} does not; rebuild with "
                                 "`make images pytorch-image`")
    labels = image_config(layer)["Config"].get("Labels") or {}
    assert labels.get("org.gpuspawner.torch-hash"), labels
    deps_layers = image_config(DEPS_IMAGE)["RootFS"]["Layers"]
    assert image_config(layer)["RootFS"]["Layers"][: len(deps_layers)] == deps_layers
    assert_stage_below(layer, image)
    proc = run(layer, "/opt/venv/bin/python", "-c",
               "import importlib.util as u; print(u.find_spec('gpuspawner') is None)")
    assert proc.stdout.split() == ["True"], proc.stdout
