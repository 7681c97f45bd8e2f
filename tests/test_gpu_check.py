"""``make gpu-check`` (:mod:`gpuspawner.gpushare.check`): on this host, which has no GPU, the
real command says so in one line and exits 2; the table, the comparisons and the exit
statuses are checked on the NVML test double with nvidia-smi answers as the real one writes
them (``--format=csv,noheader,nounits``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuspawner.gpushare import check
from gpuspawner.testing import nvml_double as nd

ROOT = Path(__file__).resolve().parents[1]
UUID0 = "GPU-6513270e-269e-0d37-f2a7-4de452e6b438"
UUID1 = "GPU-0a4f3a1c-54b1-2f7d-8e22-93a1d0c1be77"


def real_nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver: this host has no GPU
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(real_nvml_works(), reason="this host has a GPU: make gpu-check runs")
def test_make_gpu_check_without_a_gpu_says_so_in_one_line_and_exits_2():
    # the command make gpu-check runs (make collapses every failing exit status to 2)
    done = subprocess.run(
        [sys.executable, "-m", "gpuspawner.gpushare.check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert done.stdout.splitlines() == ["no GPU: nvmlInit failed: NVML Shared Library Not Found"], (
        done.stdout
    )
    # -o venv: the venv is taken as it is (never reinstalled from this checkout by a test: the
    # shared venv's editable install would point at whichever checkout ran it)
    made = subprocess.run(
        ["make", "--no-print-directory", "-s", "-o", "venv", "-o", ".venv/.installed", "gpu-check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 2
    assert "no GPU: nvmlInit failed: NVML Shared Library Not Found" in made.stdout.splitlines()


def two_a100s(**kw) -> nd.FakeNVML:
    return nd.FakeNVML(
        [
            nd.FakeGPU(UUID0, pci_bus_id="00000000:07:00.0", ecc_uncorrected=0),
            nd.FakeGPU(UUID1, pci_bus_id="00000000:87:00.0", ecc_uncorrected=None),
        ],
        **kw,
    )


class Smi:
    """nvidia-smi's answers to the queries gpu-check makes (csv, noheader, nounits)."""

    def __init__(self, inventory: str, ecc: str = "0\n", listing: str = "") -> None:
        self.inventory, self.ecc, self.listing = inventory, ecc, listing
        self.calls: list[list[str]] = []

    def __call__(self, args):
        self.calls.append(list(args))
        if args[0].startswith("--query-gpu=index,uuid"):
            return self.inventory
        if "ecc.errors" in args[0]:
            return self.ecc
        if args == ["-L"]:
            return self.listing
        raise AssertionError(f"unexpected nvidia-smi {args}")


GOOD = f"0, {UUID0}, 81920, 00000000:07:00.0\n1, {UUID1}, 81920, 00000000:87:00.0\n"
ECC = "0, 0\n1, [N/A]\n"


def test_agreeing_readings_print_one_table_and_exit_0(capsys):
    nvml = two_a100s()
    rc = check.main(["--checks", "inventory,health,mig"], nvml=nvml, smi=Smi(GOOD, ECC))
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = out.splitlines()
    assert [c.strip() for c in lines[0].split("|")] == ["check", "expected", "seen", "ok"]
    body = [line for line in lines[2:] if " | " in line]
    assert "inventory: GPU count | 2" in " ".join(" ".join(line.split()) for line in body)
    assert all(line.rstrip().endswith("ok") for line in body), out
    row = next(line for line in body if "GPU 1 uncorrected ECC" in line)
    assert "not supported" in row  # GeForce-like: NVML NotSupported, nvidia-smi [N/A]
    assert "MISMATCH" not in out and lines[-1].startswith(f"{len(body)}/{len(body)} ok")
    assert nvml.shutdown_calls >= 1


def test_a_uuid_that_nvidia_smi_does_not_report_is_a_mismatch_with_both_values(capsys):
    other = GOOD.replace(UUID1, "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff")
    rc = check.main(["--checks", "inventory"], nvml=two_a100s(), smi=Smi(other))
    out = capsys.readouterr().out
    assert rc == 1
    (row,) = [line for line in out.splitlines() if "MISMATCH" in line]
    assert "GPU 1 UUID" in row and UUID1 in row and "GPU-ffffffff" in row


def test_memory_and_ecc_disagreements_are_mismatches(capsys):
    rc = check.main(
        ["--checks", "inventory,health"],
        nvml=two_a100s(),
        smi=Smi(GOOD.replace("81920, 00000000:87", "40960, 00000000:87"), "0, 2\n1, [N/A]\n"),
    )
    out = capsys.readouterr().out
    assert rc == 1
    bad = [line for line in out.splitlines() if "MISMATCH" in line]
    assert len(bad) == 2, out
    assert "GPU 1 memory (MiB)" in bad[0] and "40960" in bad[0] and "81920" in bad[0]
    assert "GPU 0 uncorrected ECC" in bad[1]


def test_mig_instances_against_nvidia_smi_listing(capsys):
    mig = [
        nd.FakeMIG("MIG-aaaaaaaa-1111-2222-3333-444444444444", gpu_instance_id=1),
        nd.FakeMIG("MIG-bbbbbbbb-1111-2222-3333-444444444444", gpu_instance_id=2),
    ]
    nvml = nd.FakeNVML([nd.FakeGPU(UUID0, mig_mode=nd.NVML_DEVICE_MIG_ENABLE, mig=mig)])
    listing = (
        f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {UUID0})\n"
        "  MIG 1g.10gb     Device  0: (UUID: MIG-aaaaaaaa-1111-2222-3333-444444444444)\n"
        "  MIG 1g.10gb     Device  1: (UUID: MIG-bbbbbbbb-1111-2222-3333-444444444444)\n"
    )
    assert check.main(["--checks", "mig"], nvml=nvml, smi=Smi("", listing=listing)) == 0
    assert "MIG-aaaaaaaa" in capsys.readouterr().out
    one_only = listing.rsplit("  MIG", 1)[0]
    assert check.main(["--checks", "mig"], nvml=nvml, smi=Smi("", listing=one_only)) == 1
    assert "MISMATCH" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("nvml", "line"),
    [
        (
            nd.FakeNVML(init_error=nd.NVML_ERROR_DRIVER_NOT_LOADED),
            "no GPU: nvmlInit failed: NVMLError_DriverNotLoaded (code 9)",
        ),
        (nd.FakeNVML([]), "no GPU: NVML works but sees 0 GPUs"),
    ],
)
def test_no_gpu_is_exit_2_in_one_line_whatever_checks(capsys, nvml, line):
    assert check.main([], nvml=nvml, smi=Smi(GOOD)) == 2
    assert capsys.readouterr().out.splitlines() == [line]


def test_container_checks_without_an_engine_are_mismatches_not_crashes(capsys):
    class NoEngine:
        def inspect_image(self, image):
            raise RuntimeError("no such image")

    rc = check.main(
        ["--checks", "container,load,shares", "--image", "nope:0"],
        nvml=two_a100s(),
        smi=Smi(GOOD),
        engine=NoEngine(),
    )
    out = capsys.readouterr().out
    assert rc == 1
    bad = [line for line in out.splitlines() if "MISMATCH" in line]
    assert len(bad) == 3 and all("image nope:0" in line for line in bad), out


def test_a_check_that_raises_is_one_failed_row(capsys):
    def broken(args):
        raise FileNotFoundError("nvidia-smi")

    assert check.main(["--checks", "inventory"], nvml=two_a100s(), smi=broken) == 1
    out = capsys.readouterr().out
    assert "error: FileNotFoundError" in out


def test_render_pads_columns_and_exit_status_needs_rows():
    rows = [check.Row("a", "1", "1", True), check.Row("longer check", "x" * 70, "y", False)]
    text = check.render(rows).splitlines()
    assert len({len(line.split(" | ")[0]) for line in text if " | " in line}) == 1
    assert "..." in text[3] and "MISMATCH" in text[3]
    assert check.exit_status([]) == 1 and check.exit_status(rows[:1]) == 0
