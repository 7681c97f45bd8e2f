"""PyTorch's memory fraction from the share (gpuspawner.singleuser.torchshare), on a fake torch.

The fake stands for the few ``torch.cuda`` calls the module makes, including
``torch.cuda._lazy_call``'s rule (queue until CUDA initialises, run at once after). The real
torch is exercised in the PyTorch image by tests/test_pytorch_image.py.
"""

from __future__ import annotations

import sys
import types

import pytest

from gpuspawner.singleuser import torchshare

GiB = 1024**3


class FakeCuda:
    def __init__(self, totals: list[int]) -> None:
        self.totals = totals
        self.initialized = False
        self.queued: list = []
        self.fractions: dict[int, float] = {}

    def _lazy_call(self, fn) -> None:
        if self.initialized:
            fn()
        else:
            self.queued.append(fn)

    def init(self) -> None:  # what torch.cuda._lazy_init does with the queue
        self.initialized = True
        for fn in self.queued:
            fn()
        self.queued.clear()

    def device_count(self) -> int:
        assert self.initialized, "device queried before CUDA initialised"
        return len(self.totals)

    def get_device_properties(self, dev: int):
        return types.SimpleNamespace(total_memory=self.totals[dev])

    def set_per_process_memory_fraction(self, frac: float, dev: int) -> None:
        assert self.initialized
        self.fractions[dev] = frac


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    torchshare.applied.clear()
    yield
    torchshare._remove_finder()


def fake_torch(totals=(80 * GiB,)) -> types.ModuleType:
    mod = types.ModuleType("torch")
    mod.cuda = FakeCuda(list(totals))
    return mod


def test_fraction_is_limit_over_total_capped_at_one():
    assert torchshare.memory_fraction(20 * GiB, 80 * GiB) == 0.25
    assert torchshare.memory_fraction(100 * GiB, 80 * GiB) == 1.0
    with pytest.raises(ValueError):
        torchshare.memory_fraction(0, 80 * GiB)


def test_fraction_waits_for_cuda_init_then_set_on_each_device():
    torch = fake_torch((80 * GiB, 40 * GiB))
    env = {torchshare.ENV_LIMIT: str(20 * GiB)}
    assert torchshare.on_torch_imported(torch, env) is True
    assert torch.cuda.fractions == {}  # importing torch initialises nothing
    torch.cuda.init()
    assert torch.cuda.fractions == {0: 0.25, 1: 0.5}
    assert torchshare.applied == {0: 0.25, 1: 0.5}


def test_cuda_already_initialised_applies_at_once():
    torch = fake_torch()
    torch.cuda.init()
    torchshare.on_torch_imported(torch, {torchshare.ENV_LIMIT: str(40 * GiB)})
    assert torch.cuda.fractions == {0: 0.5}


@pytest.mark.parametrize("value", [None, "", "0", "lots"])
def test_no_or_bad_limit_sets_nothing(value):
    torch = fake_torch()
    env = {} if value is None else {torchshare.ENV_LIMIT: value}
    assert torchshare.on_torch_imported(torch, env) is False
    torch.cuda.init()
    assert torch.cuda.fractions == {}


def test_extension_imports_no_torch_and_hooks_the_first_import(tmp_path, monkeypatch):
    """The kernel extension adds a finder only; the notebook's own `import torch` (here a
    fake package on sys.path) runs the module and then queues the fraction."""
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import sys\n"
        "sys.modules['tests_fake_cuda_holder'].made.append(__name__)\n"
        "cuda = sys.modules['tests_fake_cuda_holder'].cuda\n"
    )
    holder = types.ModuleType("tests_fake_cuda_holder")
    holder.cuda = FakeCuda([16 * GiB])
    holder.made = []
    monkeypatch.setitem(sys.modules, "tests_fake_cuda_holder", holder)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setenv(torchshare.ENV_LIMIT, str(4 * GiB))

    torchshare.load_ipython_extension(None)
    assert "torch" not in sys.modules and holder.made == []  # nothing imported yet
    assert any(isinstance(f, torchshare._TorchFinder) for f in sys.meta_path)

    import torch  # noqa: F401  (the fake)

    assert holder.made == ["torch"]
    assert not any(isinstance(f, torchshare._TorchFinder) for f in sys.meta_path)  # one shot
    assert holder.cuda.queued and holder.cuda.fractions == {}
    holder.cuda.init()
    assert holder.cuda.fractions == {0: 0.25}


def test_install_without_limit_adds_no_hook(monkeypatch):
    monkeypatch.delenv(torchshare.ENV_LIMIT, raising=False)
    assert torchshare.install() == "no limit"
    assert not any(isinstance(f, torchshare._TorchFinder) for f in sys.meta_path)
