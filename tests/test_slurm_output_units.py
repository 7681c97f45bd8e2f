"""gpuspawner.backends.slurm.output without a cluster: the executor of output reads (its
bound, the limit per user, the deadline), the check of a result frame's key, and how a path is
opened (links, FIFOs, owners), on this machine's file system."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import threading
import time
from pathlib import Path

import pytest

from gpuspawner.backends.base import BackendError
from gpuspawner.backends.slurm.common import SlurmConfigError
from gpuspawner.backends.slurm.output import (
    OutputReads,
    OutputRefused,
    authentic_frames,
    check_output_settings,
    read_tail,
)
from gpuspawner.jobs import execute
from gpuspawner.jobs.model import parse_output


def frame(result: dict, key: str = "") -> bytes:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        execute.emit(result, key)
    return buf.getvalue().encode()


def test_reads_of_one_user_never_take_the_threads_of_another() -> None:
    """One user's reads that hang until their deadline hold at most ``per_user`` threads;
    that user's next read waits and then fails, naming the limit; another user's read runs at
    once; every read ends by its deadline."""
    reads = OutputReads(threads=3, per_user=2, timeout=1.5)
    started = threading.Semaphore(0)

    def hang(deadline: float) -> str:  # a read that honours its deadline only
        started.release()
        while time.monotonic() < deadline:
            time.sleep(0.01)
        return "late"

    async def main() -> tuple[list, float, float]:
        hogs = [asyncio.create_task(reads.run("mallory", hang)) for _ in range(3)]
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        other = await reads.run("alice", lambda deadline: "alice's")
        quick = time.monotonic() - t0
        results = await asyncio.gather(*hogs, return_exceptions=True)
        return [other, *results], quick, time.monotonic() - t0

    try:
        (other, *hogs), quick, total = asyncio.run(main())
    finally:
        reads.close()
    assert other == "alice's" and quick < 0.5
    assert hogs.count("late") == 2
    (refused,) = [h for h in hogs if isinstance(h, BackendError)]
    assert "2 reads of uid mallory's job output are running already" in str(refused)
    assert total < 3.0


def test_only_frames_with_the_jobs_key_count() -> None:
    key, other = "a1" * 32, "b2" * 32
    real = frame({"notebook": {"cells": [], "real": True}, "error": None}, key)
    forged = frame({"notebook": {"cells": [], "forged": True}, "error": None})
    wrong = frame({"notebook": {"cells": [], "wrong key": True}, "error": None}, other)
    out = b"log\n" + real + b"more log\n" + forged + wrong
    assert parse_output(real + forged)["notebook"].get("forged")  # unchecked: the last counts
    kept = authentic_frames(out, key)
    assert parse_output(kept)["notebook"] == {"cells": [], "real": True}
    assert parse_output(authentic_frames(forged + wrong, key)) is None
    # a frame's body changed after signing, or a marker with no frame around it
    body = real.replace(b"\n", b"\n ", 1)
    tampered = real[:len(real) // 2] + b"A" + real[len(real) // 2 + 1:]
    assert parse_output(authentic_frames(tampered, key)) is None
    assert parse_output(authentic_frames(body, key)) is not None  # white space is no change
    assert parse_output(authentic_frames(real + execute.END.encode() + b"\n", key)) is not None
    assert parse_output(authentic_frames(execute.BEGIN.encode() + b"\n" + real, key)) \
        is not None


def test_read_tail_opens_no_link_no_fifo_and_only_the_owners_file(tmp_path: Path) -> None:
    uid = os.getuid()
    f = tmp_path / "out"
    f.write_bytes(b"0123456789")
    far = time.monotonic() + 5
    assert read_tail(str(f), 4, uid, far) == b"6789"
    assert read_tail(str(f), 100, None, far) == b"0123456789"
    assert read_tail(str(f), 4, uid, time.monotonic() - 1) == b""  # past its deadline
    with pytest.raises(OutputRefused, match=r"belongs to uid \d+, not to the job's user"):
        read_tail(str(f), 4, uid + 12345, far)
    os.mkfifo(tmp_path / "fifo")
    t0 = time.monotonic()
    with pytest.raises(OutputRefused, match="is a FIFO, not a regular file"):
        read_tail(str(tmp_path / "fifo"), 4, uid, far)
    assert time.monotonic() - t0 < 1
    (tmp_path / "link").symlink_to(f)
    with pytest.raises(OutputRefused, match="is a symbolic link: refused"):
        read_tail(str(tmp_path / "link"), 4, uid, far)
    for bad in ("relative/out", f"{tmp_path}/../x/out"):
        with pytest.raises(OutputRefused):
            read_tail(bad, 4, uid, far)
    with pytest.raises(FileNotFoundError):
        read_tail(str(tmp_path / "missing"), 4, uid, far)
    # a folder on the way that is a link: followed only when root owns the link
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "out").write_bytes(b"abc")
    (tmp_path / "dl").symlink_to(tmp_path / "d")
    if uid == 0:
        assert read_tail(str(tmp_path / "dl" / "out"), 10, uid, far) == b"abc"
        os.lchown(tmp_path / "dl", 12345, 12345)
    with pytest.raises(OutputRefused, match="is a symbolic link of uid"):
        read_tail(str(tmp_path / "dl" / "out"), 10, uid, far)


def test_an_output_pattern_in_a_folder_every_account_may_write_is_refused(
        tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(SlurmConfigError, match=r"SlurmBackend.output: .* every account may"):
        check_output_settings(f"{shared}/%x-%j.out", "/var/lib/x")
    with pytest.raises(SlurmConfigError, match="SlurmBackend.output: must be an absolute"):
        check_output_settings("logs/%x-%j.out", "/var/lib/x")
    check_output_settings(f"{tmp_path}/%x-%j.out", "/var/lib/x")  # 0700, the admin's
    with pytest.raises(SlurmConfigError, match=r"SlurmBackend.output_dir .* mode 0o1777"):
        check_output_settings("", str(shared))
    check_output_settings("", str(tmp_path / "made-at-first-launch"))
