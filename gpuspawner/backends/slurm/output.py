"""A Slurm job's output file, where no other user can write it, and how the hub reads it.

A job's ``--output`` file is made by slurmstepd as the job's user, so its folder must be the
user's to write. Under the default layout (``c.SlurmBackend.output`` unset) it is
``<output_dir>/<uid>/%x-%j.out``: ``output_dir`` is the admin's folder (root's, no other
account may write it: :func:`check_base`), ``<uid>`` a folder 0700 of the user that the hub
makes before each submission (:func:`ensure_user_folder`). No other user can create the path
first, put a link or a FIFO there, read the file or append to it.

The hub reads a file there (a notebook job's log and result, a server's last lines) by
:func:`read_tail`: each folder of the path is opened without following a link the user may
have put there (``O_NOFOLLOW``, one ``openat`` per component; only a link owned by root, which
no user can make, is followed), the file itself without following a link and without blocking
(``O_NONBLOCK``: a FIFO cannot hold the read), then checked (``fstat`` of the open file) to be
a regular file of the job's user: a FIFO, a link, a device or a file of another owner is
refused with :class:`OutputRefused`, whose message says which. Only the last ``max_bytes`` are
read, in chunks, and the read ends at its deadline.

Reads run in an executor of their own (:class:`OutputReads`: a bounded number of threads)
with a limit on the reads of one user at a time, so no user's files can hold the threads the
hub needs for others (its default executor makes the certificates of every spawn).

A notebook job's result frame is trusted only when it carries the HMAC of its body with the
job's own key (:func:`frame_mac`): the hub makes the key at launch, the job gets it in its
script's environment (read by the user alone), and :func:`authentic_frames` drops every frame
of the output that does not carry it, so a frame appended by anyone else is ignored.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import hashlib
import hmac
import os
import stat
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ...jobs.model import OUTPUT_BEGIN, OUTPUT_END
from ..base import BackendError
from .common import SlurmConfigError

__all__ = ["MAC_PREFIX", "RESULT_KEY_ENV", "OutputRefused", "OutputReads", "authentic_frames",
           "check_base", "check_output_settings", "ensure_user_folder", "frame_mac",
           "read_tail", "user_pattern"]

#: the environment variable that hands a notebook job its result key (hex)
RESULT_KEY_ENV = "GPUSPAWNER_JOB_RESULT_KEY"
#: the last line of a signed frame's body: this, then the HMAC-SHA256 (hex)
MAC_PREFIX = "hmac-sha256:"
#: bytes read per call (the deadline is checked between calls)
CHUNK = 1 << 16
T = TypeVar("T")


class OutputRefused(BackendError):
    """A job's output file the hub will not read: a link, a FIFO or anything but a regular
    file, a file of another owner, or a folder on its path that is a link; the message names
    the path and why."""


def user_pattern(base: str, uid: int) -> str:
    """The ``--output`` pattern of the default layout: ``<base>/<uid>/%x-%j.out``."""
    return os.path.join(base, str(int(uid)), "%x-%j.out")


def check_base(base: str, make: bool = True) -> None:
    """Check (and with ``make``, make, 0711) ``c.SlurmBackend.output_dir``: an absolute path
    of a folder owned by root (or by the hub's own account) that no other account may write,
    since the users' folders are made in it.

    Raises:
        OutputRefused: not absolute, not a folder, owned by another account, or writable by
            the group or others (the message names ``SlurmBackend.output_dir``).
    """
    where = f"SlurmBackend.output_dir {base!r}"
    if not base.startswith("/"):
        raise OutputRefused(f"{where}: must be an absolute path")
    if make and not os.path.lexists(base):
        old = os.umask(0o022)
        try:
            os.makedirs(base, mode=0o711, exist_ok=True)
        except OSError as e:
            raise OutputRefused(f"{where}: cannot make it: {e.strerror}") from None
        finally:
            os.umask(old)
    try:
        st = os.stat(base)  # the admin's path: links in it are the admin's
    except OSError as e:
        raise OutputRefused(f"{where}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise OutputRefused(f"{where}: is not a folder")
    if st.st_uid not in (0, os.geteuid()):
        raise OutputRefused(f"{where}: belongs to uid {st.st_uid}; it must be root's")
    if st.st_mode & 0o022:
        raise OutputRefused(f"{where}: mode {oct(st.st_mode & 0o7777)} lets other accounts "
                            "write it (another user could put the users' folders there): "
                            "make it 0711 or 0755")


def check_output_settings(output: str, output_dir: str) -> None:
    """At hub start: a pattern ``output`` must be absolute, and the folder it names (up to its
    first ``%``) must not be writable by every account (there another user could create the
    file first, or a link); without one, ``output_dir`` must be absolute and, when it exists,
    the admin's (:func:`check_base`; the hub makes it at the first launch otherwise).

    Raises:
        SlurmConfigError: naming ``SlurmBackend.output`` or ``SlurmBackend.output_dir``.
    """
    if output:
        if not output.startswith("/"):
            raise SlurmConfigError(f"SlurmBackend.output: must be an absolute path, got "
                                   f"{output!r}")
        folder = os.path.dirname(output.split("%", 1)[0]) or "/"
        try:
            st = os.stat(folder)
        except OSError:
            return  # made by the admin on the nodes' shared file system
        if st.st_mode & 0o002:
            raise SlurmConfigError(
                f"SlurmBackend.output: {output!r} is in {folder}, which every account may "
                "write: another user could create the output file first or put a link there, "
                "and read or forge what the job writes. Leave output unset (a folder 0700 per "
                "user under SlurmBackend.output_dir)")
        return
    if not output_dir.startswith("/"):
        raise SlurmConfigError(f"SlurmBackend.output_dir: must be an absolute path, got "
                               f"{output_dir!r}")
    if os.path.lexists(output_dir):
        try:
            check_base(output_dir, make=False)
        except OutputRefused as e:
            raise SlurmConfigError(str(e)) from None


def ensure_user_folder(base: str, uid: int, gid: int) -> str:
    """Make ``<base>/<uid>``, a folder 0700 of ``uid:gid`` (blocking; the hub must be root to
    make it; one that is already the user's 0700 folder is kept). Returns its path.

    Raises:
        OutputRefused: ``base`` is not the admin's (:func:`check_base`), or the folder is a
            link, not a folder, belongs to another uid, or cannot be made (the hub is not
            root: then an admin makes it).
    """
    check_base(base)
    path = os.path.join(base, str(int(uid)))
    dfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            os.mkdir(str(int(uid)), 0o700, dir_fd=dfd)
        except FileExistsError:
            pass
        except OSError as e:
            raise OutputRefused(f"the output folder {path} of uid {uid} cannot be made "
                                f"({e.strerror}): the hub makes it as root; else an admin "
                                f"makes it, 0700 and owned by {uid}:{gid}") from None
        try:
            fd = os.open(str(int(uid)), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                         | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as e:
            raise OutputRefused(f"the output folder {path} of uid {uid} is no folder "
                                f"({e.strerror}): refused") from None
        try:
            st = os.fstat(fd)
            if st.st_uid == 0 and uid != 0:  # made just now (or left by a failed try)
                os.fchown(fd, uid, gid)
            elif st.st_uid != uid:
                raise OutputRefused(f"the output folder {path} belongs to uid {st.st_uid}, "
                                    f"not to uid {uid}: refused")
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.fchmod(fd, 0o700)
        except PermissionError as e:
            raise OutputRefused(f"the output folder {path} cannot be made the user's "
                                f"({e.strerror}): the hub must run as root") from None
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
    return path


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISLNK, "a symbolic link"),
          (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _open_parent(path: str) -> tuple[int, str]:
    """An ``O_PATH`` descriptor of ``path``'s folder, reached one component at a time from
    ``/`` without following a link (a link owned by root is followed: no user can make one),
    and the file's name in it.

    Raises:
        OutputRefused: a relative path, a ``..``, or a folder on the way that is a link of a
            user or no folder.
        OSError: a folder is missing or cannot be entered.
    """
    if not path.startswith("/"):
        raise OutputRefused(f"the output file {path!r} is no absolute path: refused")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise OutputRefused(f"the output file {path!r} names no file or has '..': refused")
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    fd = os.open("/", flags)
    try:
        where = ""
        for part in parts[:-1]:
            where += "/" + part
            try:
                nfd = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise OutputRefused(f"{where} on the way to the output file {path} is "
                                        f"{_kind(st.st_mode)}, not a folder: refused") from None
                if st.st_uid != 0:
                    raise OutputRefused(f"{where} on the way to the output file {path} is a "
                                        f"symbolic link of uid {st.st_uid}: refused, not "
                                        "followed") from None
                nfd = os.open(part, flags, dir_fd=fd)  # root's link: the admin's
            os.close(fd)
            fd = nfd
        return fd, parts[-1]
    except BaseException:
        os.close(fd)
        raise


def read_tail(path: str, max_bytes: int, uid: int | None, deadline: float) -> bytes:
    """The last ``max_bytes`` bytes of the job's output file ``path`` (blocking, at most until
    ``deadline``, a :func:`time.monotonic` time: a read past it stops and returns what it
    has). The path is opened as the module's docstring says; the file must be a regular file
    of ``uid`` (any owner when ``uid`` is None, which only a hub running as the user has).

    Raises:
        OutputRefused: a link, a FIFO or other non-regular file, a file of another owner, a
            link of a user among its folders (the message names the path and why).
        OSError: it does not exist or cannot be read.
    """
    max_bytes = max(1, int(max_bytes))
    parent, name = _open_parent(path)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                         | os.O_CLOEXEC, dir_fd=parent)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EMLINK):
                raise OutputRefused(f"the output file {path} is a symbolic link: refused, not "
                                    "followed") from None
            if e.errno == errno.ENXIO:  # a socket, or a FIFO some kernels refuse so
                raise OutputRefused(f"the output file {path} is a socket or a FIFO, not a "
                                    "regular file: refused") from None
            raise
    finally:
        os.close(parent)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OutputRefused(f"the output file {path} is {_kind(st.st_mode)}, not a regular "
                                "file: refused")
        if uid is not None and st.st_uid != uid:
            raise OutputRefused(f"the output file {path} belongs to uid {st.st_uid}, not to the "
                                f"job's user (uid {uid}): refused")
        pos = max(0, st.st_size - max_bytes)
        chunks: list[bytes] = []
        left = min(max_bytes, st.st_size)
        while left > 0 and time.monotonic() < deadline:
            data = os.pread(fd, min(CHUNK, left), pos)
            if not data:
                break
            chunks.append(data)
            pos += len(data)
            left -= len(data)
        return b"".join(chunks)
    finally:
        os.close(fd)


class OutputReads:
    """The executor of output reads: at most ``threads`` threads of its own, at most
    ``per_user`` reads of one user at a time, each read with a deadline (``timeout``
    seconds, waiting for its turn included)."""

    def __init__(self, threads: int = 4, per_user: int = 2, timeout: float = 10.0) -> None:
        if threads < 1 or per_user < 1 or not timeout > 0:
            raise ValueError(f"output reads need threads >= 1, per_user >= 1 and timeout > 0, "
                             f"got {threads}, {per_user}, {timeout}")
        self.threads, self.per_user, self.timeout = threads, per_user, timeout
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # each user's (event loop, semaphore, reads running or waiting)
        self._users: dict[Any, list[Any]] = {}

    def executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """The executor's threads (made on first use)."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.threads, thread_name_prefix="gpuspawner-slurm-output")
        return self._pool

    def _slot(self, user: Any) -> asyncio.Semaphore:
        """``user``'s semaphore (one per event loop), counted as in use until :meth:`_done`."""
        loop = asyncio.get_running_loop()
        held = self._users.get(user)
        if held is None or held[0] is not loop:
            held = [loop, asyncio.Semaphore(self.per_user), 0]
            self._users[user] = held
        held[2] += 1
        return held[1]

    def _done(self, user: Any) -> None:
        held = self._users.get(user)
        if held is not None:
            held[2] -= 1
            if held[2] <= 0:
                del self._users[user]

    async def run(self, user: Any, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args, deadline)`` in the executor as one of ``user``'s reads (``deadline``: a
        :func:`time.monotonic` time ``timeout`` seconds from now, which ``fn`` must honour).

        Raises:
            BackendError: ``user`` had ``per_user`` reads running for the whole ``timeout``,
                or the executor had no free thread in time (the read is not started then).
            Whatever ``fn`` raises.
        """
        deadline = time.monotonic() + self.timeout
        slot = self._slot(user)
        try:
            try:
                await asyncio.wait_for(slot.acquire(), self.timeout)
            except asyncio.TimeoutError:
                raise BackendError(f"{self.per_user} reads of uid {user}'s job output are "
                                   f"running already; none ended in {self.timeout:g} s"
                                   ) from None
            try:
                loop = asyncio.get_running_loop()
                fut = loop.run_in_executor(self.executor(), fn, *args, deadline)
                try:
                    # fn ends itself at the deadline; a second more for the thread to hand over
                    return await asyncio.wait_for(asyncio.shield(fut),
                                                  max(0.0, deadline - time.monotonic()) + 1.0)
                except asyncio.TimeoutError:
                    fut.cancel()  # not started yet: it never runs
                    raise BackendError(f"reading uid {user}'s job output took more than "
                                       f"{self.timeout:g} s") from None
            finally:
                slot.release()
        finally:
            self._done(user)

    def close(self) -> None:
        """Stop the threads (reads running finish at their deadline)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def frame_mac(key: str, body: str) -> str:
    """The HMAC-SHA256 (hex) of a result frame's ``body`` (its base64 text with no white
    space) with the job's ``key``."""
    return hmac.new(key.encode("ascii"), b"gpuspawner job result\n" + body.encode("ascii"),
                    hashlib.sha256).hexdigest()


_DEFUSED_BEGIN = b"----- (a result frame without the job's key, ignored) -----"
_DEFUSED_END = b"----- (end of the ignored frame) -----"


def authentic_frames(out: bytes, key: str) -> bytes:
    """``out`` with only the result frames that carry ``key``'s HMAC as their last line
    (:func:`frame_mac`; that line removed, so that :func:`~gpuspawner.jobs.model.parse_output`
    reads them as before); the markers of every other frame, and any marker outside a frame,
    are replaced by words that say so, so a frame someone else appended is never parsed."""
    begin, end = OUTPUT_BEGIN.encode(), OUTPUT_END.encode()
    parts: list[bytes] = []
    i = 0
    while True:
        b = out.find(begin, i)
        if b < 0:
            parts.append(_defuse(out[i:]))
            break
        e = out.find(end, b + len(begin))
        if e < 0:
            parts.append(_defuse(out[i:]))
            break
        inner_begin = out.rfind(begin, b, e)  # the last BEGIN before this END
        parts.append(_defuse(out[i:inner_begin]))
        body = out[inner_begin + len(begin):e]
        kept = _verified(body, key)
        if kept is None:
            parts.append(_DEFUSED_BEGIN + body + _DEFUSED_END)
        else:
            parts.append(begin + kept + end)
        i = e + len(end)
    return b"".join(parts)


def _defuse(text: bytes) -> bytes:
    return text.replace(OUTPUT_BEGIN.encode(), _DEFUSED_BEGIN).replace(
        OUTPUT_END.encode(), _DEFUSED_END)


def _verified(body: bytes, key: str) -> bytes | None:
    """The frame's body less its MAC line when the MAC is ``key``'s, else None."""
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        return None
    lines = text.strip().splitlines()
    if not lines or not lines[-1].startswith(MAC_PREFIX):
        return None
    mac = lines[-1][len(MAC_PREFIX):].strip()
    data = "".join("".join(lines[:-1]).split())
    if not hmac.compare_digest(mac, frame_mac(key, data)):
        return None
    return ("\n" + "\n".join(lines[:-1]) + "\n").encode("ascii")
