"""The program inside a notebook job's container: it runs as the user (the container's uid),
with the user's home mounted at ``$HOME``, and executes the job's notebook once with papermill.

The hub runs it as ``python3 -c <this file's source>`` (as the home helper is run), so a job
needs papermill in its image, not this package's version of the image. Standard library only
at the top; papermill is imported when the notebook runs.

Input (environment): the notebook in ``GPUSPAWNER_JOB_NOTEBOOK_<i>`` (zlib + base64, in
``GPUSPAWNER_JOB_NOTEBOOK_CHUNKS`` chunks), ``GPUSPAWNER_JOB_PARAMETERS`` (JSON object),
``GPUSPAWNER_JOB_OUTPUT_DIR`` (relative to ``$HOME``: ``jobs/<name>/<UTC start>-<id>``),
``GPUSPAWNER_JOB_NAME``, ``GPUSPAWNER_JOB_OUTPUT_FORMATS`` (``ipynb,html``: the HTML export is
made only when ``html`` is in it) and ``GPUSPAWNER_JOB_INPUT_FOLDER`` (a folder of the home
copied into the output folder first: :func:`copy_input_folder`).

Output, in that folder, written as the user: ``<name>.input.ipynb`` (the snapshot),
``<name>.ipynb``
(the executed notebook, saved by papermill after every cell), ``<name>.html`` (the executed
notebook exported by nbconvert's ``HTMLExporter``, when nbconvert is in the image: it is with
jupyterlab, whose jupyter_server needs it), ``job.log`` (papermill's log with the cells'
output). On standard output, between the markers of :mod:`gpuspawner.jobs.model`, the result
for the hub: base64 lines of zlib-compressed JSON ``{"notebook": ..., "error": ..., "html":
...}`` (``html`` is null when there is none or it is larger than
``GPUSPAWNER_JOB_MAX_HTML_BYTES``, default 16 MiB: it stays in the folder then). When the hub
gave the job a key (``GPUSPAWNER_JOB_RESULT_KEY``, hex: the Slurm backend does, in the job's
script), the frame's last line is ``hmac-sha256:`` and the HMAC-SHA256 of its base64 text with
that key (:func:`gpuspawner.backends.slurm.output.frame_mac`): the hub trusts no frame without
it, so another user who could append to the output file cannot forge the result. The key is
taken out of the environment before the notebook runs.

Standard error is standard output (``dup2``): the log lines (these, papermill's, the cells'
output papermill logs, the kernel's own messages) and the result reach the hub in one stream
in their order, which the hub reads as the job's log (``GET api/jobs/{id}/log``).

Exit status: 0 done, 1 a cell raised, 2 anything else (no kernel, papermill missing, ...),
143 terminated (SIGTERM from outside the container: time limit, cancel, the engine), 3 ended
by a signal sent from inside the job (:data:`KILLED_FROM_INSIDE`).

As the container's PID 1 (a job's container without an entrypoint of its own, as the
shipped image), the program is a small supervisor (:func:`supervise`): the notebook runs in a
child process, and a SIGTERM is told apart by its sender (``sigwaitinfo``'s ``si_pid`` and
``si_code``): one sent through the engine (``docker stop``: the hub's time limit or cancel,
someone stopping the container, the engine shutting down) comes from outside the container's
PID namespace (``si_pid`` 0, ``SI_USER``), one the job sends itself (``kill -TERM 1``) from a
process inside it. Only the first ends the program with 143, which the hub reads as stopped
from outside (a lost job, retried); any other end by a signal is 3 (a failed job, not
retried), so a job cannot earn its own retries. The supervisor also reaps orphaned processes,
as a PID 1 should.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import signal
import sys
import textwrap
import zlib

BEGIN = "----- gpuspawner job result begin -----"
#: the largest HTML export handed back to the hub (bytes), unless the environment says
MAX_HTML_BYTES = 16 * 2**20
END = "----- gpuspawner job result end -----"
#: the environment variable of the result key, and the frame's MAC line prefix
KEY_ENV = "GPUSPAWNER_JOB_RESULT_KEY"
MAC_PREFIX = "hmac-sha256:"
log = logging.getLogger("gpuspawner.job")


class Terminated(BaseException):
    """SIGTERM: the time limit or a cancel (a BaseException: nothing may swallow it)."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def read_notebook(env: dict[str, str]) -> bytes:
    """The notebook's JSON from the environment."""
    n = int(env["GPUSPAWNER_JOB_NOTEBOOK_CHUNKS"])
    text = "".join(env[f"GPUSPAWNER_JOB_NOTEBOOK_{i}"] for i in range(n))
    return zlib.decompress(base64.b64decode(text))


def emit(result: dict[str, object], key: str = "") -> None:
    """The result, framed, on standard output; with ``key`` (hex text) its last line is the
    HMAC-SHA256 of the base64 text (the module's docstring)."""
    data = base64.b64encode(zlib.compress(json.dumps(result).encode("utf-8"), 9)).decode()
    lines = textwrap.wrap(data, 76)
    if key:
        mac = hmac.new(key.encode("ascii"), b"gpuspawner job result\n" + data.encode("ascii"),
                       hashlib.sha256).hexdigest()
        lines.append(MAC_PREFIX + mac)
    sys.stdout.write(BEGIN + "\n" + "\n".join(lines) + "\n" + END + "\n")
    sys.stdout.flush()


#: the most bytes and files of an input folder a job copies (``GPUSPAWNER_JOB_INPUT_MAX_BYTES``
#: and ``..._FILES`` may say less or more)
INPUT_MAX_BYTES = 2**30
INPUT_MAX_FILES = 10_000


class InputFolderError(Exception):
    """The input folder cannot be given to the job (the message says why)."""


def copy_input_folder(home: str, relative: str, dest: str, max_bytes: int = INPUT_MAX_BYTES,
                      max_files: int = INPUT_MAX_FILES) -> tuple[int, int, list[str]]:
    """Copy the folder ``relative`` of ``home`` into ``dest`` (the job's output folder), as
    jupyter-scheduler's "Run job with input folder" copies the notebook's folder beside it:
    the notebook then reads its neighbours by relative paths. Run as the user, inside the
    job: the hub never reads a home.

    Only what is inside the home is copied: the folder, with its links resolved, must be
    the home or under it; inside it, no link is followed (links to files or folders are
    skipped and named in the log), only regular files are copied (each opened with
    ``O_NOFOLLOW``), and the home's ``jobs`` folder (the jobs' outputs, this one's included)
    is left out.

    Returns:
        (files, bytes) copied and the links skipped (relative paths).

    Raises:
        InputFolderError: it is not a folder, it is outside the home, or it holds more than
            ``max_bytes`` bytes or ``max_files`` files.
    """
    import stat

    real_home = os.path.realpath(home)
    src = os.path.realpath(os.path.join(home, relative))
    if src != real_home and not src.startswith(real_home + os.sep):
        raise InputFolderError(f"{relative!r} is outside your home")
    if not os.path.isdir(src):
        raise InputFolderError(f"{relative!r} is not a folder of your home")
    skip = {os.path.join(real_home, "jobs"), os.path.realpath(dest)}
    files = size = 0
    links: list[str] = []
    for root, dirs, names in os.walk(src, followlinks=False):
        keep = []
        for d in dirs:
            path = os.path.join(root, d)
            if os.path.islink(path):
                links.append(os.path.relpath(path, src))
            elif path not in skip:
                keep.append(d)
        dirs[:] = keep
        out_root = os.path.join(dest, os.path.relpath(root, src))
        os.makedirs(out_root, exist_ok=True)
        for n in names:
            path = os.path.join(root, n)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                links.append(os.path.relpath(path, src))
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            files += 1
            size += info.st_size
            if files > max_files or size > max_bytes:
                raise InputFolderError(f"{relative!r} holds more than {max_files} files or "
                                       f"{max_bytes} bytes")
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f_in, \
                    open(os.path.join(out_root, n), "wb") as f_out:
                while chunk := f_in.read(2**20):
                    f_out.write(chunk)
    return files, size, links


def export_html(notebook_path: str, html_path: str) -> str | None:
    """Export the notebook at ``notebook_path`` to HTML with nbconvert's ``HTMLExporter``
    (its default template, ``lab``), write it to ``html_path`` and return it; None (logged)
    when nbconvert is not installed or the export fails: the job's result does not depend
    on it."""
    try:
        from nbconvert import HTMLExporter
    except ImportError as e:
        log.warning("no HTML export: nbconvert is not installed in this image (%s)", e)
        return None
    try:
        body, _ = HTMLExporter().from_filename(notebook_path)
        with open(html_path, "w", encoding="utf-8") as f:
            f.write(body)
    except Exception as e:  # a template missing, a notebook it cannot read, a full disk
        log.warning("no HTML export: %s: %s", type(e).__name__, e)
        return None
    return str(body)


def run(env: dict[str, str]) -> int:
    """Execute the job's notebook; returns the exit status."""
    key = env.pop(KEY_ENV, "")
    os.environ.pop(KEY_ENV, None)  # the notebook's kernel does not inherit it
    home = env.get("HOME") or os.getcwd()
    name = env.get("GPUSPAWNER_JOB_NAME") or "notebook"
    folder = os.path.join(home, env["GPUSPAWNER_JOB_OUTPUT_DIR"])
    os.makedirs(folder, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        handlers=[logging.FileHandler(os.path.join(folder, "job.log")),
                                  logging.StreamHandler(sys.stderr)])
    formats = (env.get("GPUSPAWNER_JOB_OUTPUT_FORMATS") or "ipynb,html").split(",")
    relative = env.get("GPUSPAWNER_JOB_INPUT_FOLDER")
    if relative is not None:
        try:
            files, size, links = copy_input_folder(
                home, relative, folder,
                int(env.get("GPUSPAWNER_JOB_INPUT_MAX_BYTES") or INPUT_MAX_BYTES),
                int(env.get("GPUSPAWNER_JOB_INPUT_MAX_FILES") or INPUT_MAX_FILES))
        except (InputFolderError, OSError) as e:
            log.error("input folder: %s", e)
            emit({"notebook": None, "error": {"ename": "InputFolderError",
                                              "evalue": f"input folder: {e}", "cell": None}},
                 key)
            return 2
        log.info("input folder %s: %d files, %d bytes copied into %s%s", relative or ".",
                 files, size, folder,
                 f"; links not followed: {', '.join(links[:20])}" if links else "")
    source = read_notebook(env)
    params = json.loads(env.get("GPUSPAWNER_JOB_PARAMETERS") or "{}")
    input_path = os.path.join(folder, f"{name}.input.ipynb")
    output_path = os.path.join(folder, f"{name}.ipynb")
    with open(input_path, "wb") as f:
        f.write(source)
    kernel = ((json.loads(source).get("metadata") or {}).get("kernelspec") or {}).get(
        "name") or "python3"
    log.info("job %s: executing %s with kernel %s, parameters %s, in %s", name, input_path,
             kernel, json.dumps(params), folder)
    error: dict[str, object] | None = None
    code = 0
    try:
        import papermill
    except ImportError as e:
        log.error("papermill is not installed in this image: %s", e)
        emit({"notebook": None, "error": {"ename": "ImportError", "evalue": str(e),
                                          "cell": None}}, key)
        return 2
    try:
        papermill.execute_notebook(input_path, output_path, parameters=params,
                                   kernel_name=kernel, log_output=True, progress_bar=False,
                                   cwd=folder)
    except papermill.PapermillExecutionError as e:
        code = 1
        error = {"ename": e.ename, "evalue": e.evalue, "cell": e.exec_count,
                 "cell_index": e.cell_index}
        log.error("cell %s raised %s: %s", e.exec_count, e.ename, e.evalue)
    except Exception as e:  # no such kernel, a dead kernel, ...
        code = 2
        error = {"ename": type(e).__name__, "evalue": str(e)[:2000], "cell": None}
        log.error("the notebook could not be executed: %s: %s", type(e).__name__, e)
    notebook = None
    try:
        with open(output_path, encoding="utf-8") as f:
            notebook = json.load(f)
    except (OSError, ValueError) as e:
        log.error("no executed notebook to hand over: %s", e)
    html = export_html(output_path, os.path.join(folder, f"{name}.html")) \
        if notebook is not None and "html" in formats else None
    max_html = int(env.get("GPUSPAWNER_JOB_MAX_HTML_BYTES") or MAX_HTML_BYTES)
    if html is not None and len(html.encode("utf-8")) > max_html:
        log.warning("the HTML export is larger than %d bytes: it stays in %s only", max_html,
                    folder)
        html = None
    emit({"notebook": notebook, "error": error, "html": html}, key)
    log.info("job %s: done, exit status %d", name, code)
    return code


#: exit status of a job ended by a signal sent from inside it (the hub: failed, not lost)
KILLED_FROM_INSIDE = 3
#: ``si_code`` of a signal sent by kill(2) (<bits/siginfo-consts.h>); a process cannot forge
#: it for another process (rt_sigqueueinfo refuses si_code >= 0)
SI_USER = 0


def execute(env: dict[str, str]) -> int:
    """Run the job (:func:`run`), SIGTERM ending it with 143."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = run(env)
    except Terminated:
        log.error("terminated (time limit or cancel)")
        code = 143
    logging.shutdown()
    sys.stdout.flush()
    return code


def _say(text: str) -> None:
    os.write(1, f"gpuspawner job: {text}\n".encode())


def supervise(env: dict[str, str]) -> int:
    """As PID 1 of the job's container: run :func:`execute` in a child process, pass it a
    SIGTERM, reap every process that ends; returns the exit status (the module's docstring):
    the child's, except that an end by a signal that did not come from outside the
    container is :data:`KILLED_FROM_INSIDE`."""
    watched = {signal.SIGTERM, signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)
        os._exit(execute(env))
    from_outside = False
    inside = ""
    while True:
        info = signal.sigwaitinfo(watched)
        if info.si_signo == signal.SIGTERM:
            if info.si_code == SI_USER and info.si_pid == 0:
                from_outside = True  # through the engine: docker stop, the engine's end
            elif not inside:
                inside = f"SIGTERM from pid {info.si_pid} inside the job"
                _say(f"{inside}: the job ends, failed")
            try:
                os.kill(child, signal.SIGTERM)
            except ProcessLookupError:
                pass
            continue
        while True:  # SIGCHLD: reap what ended (the job's orphans too)
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return KILLED_FROM_INSIDE
            if pid == 0:
                break
            if pid != child:
                continue
            code = os.waitstatus_to_exitcode(status)
            if code < 0:  # the child was killed by a signal
                _say(f"the job's program was killed by signal {-code}")
                return KILLED_FROM_INSIDE if not from_outside else 128 - code
            if code == 143 and not from_outside:
                return KILLED_FROM_INSIDE
            if inside and code != 143:
                return KILLED_FROM_INSIDE
            return code


def main() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(1, 2)  # one stream, in order: the log and the result (the module's docstring)
    env = dict(os.environ)
    if os.getpid() == 1 and hasattr(signal, "sigwaitinfo"):
        sys.exit(supervise(env))
    sys.exit(execute(env))


if __name__ == "__main__":
    main()
