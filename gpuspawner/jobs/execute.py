"""The program inside a notebook job's container: it runs as the user (the container's uid),
with the user's home mounted at ``$HOME``, and executes the job's notebook once with papermill.

The hub runs it as ``python3 -c <this file's source>`` (as the home helper is run), so a job
needs papermill in its image, not this package's version of the image. Standard library only
at the top; papermill is imported when the notebook runs.

Input (environment): the notebook in ``GPUSPAWNER_JOB_NOTEBOOK_<i>`` (zlib + base64, in
``GPUSPAWNER_JOB_NOTEBOOK_CHUNKS`` chunks), ``GPUSPAWNER_JOB_PARAMETERS`` (JSON object),
``GPUSPAWNER_JOB_OUTPUT_DIR`` (relative to ``$HOME``: ``jobs/<name>/<UTC start>-<id>``) and
``GPUSPAWNER_JOB_NAME``.

Output, in that folder, written as the user: ``<name>.input.ipynb`` (the snapshot),
``<name>.ipynb``
(the executed notebook, saved by papermill after every cell), ``<name>.html`` (the executed
notebook exported by nbconvert's ``HTMLExporter``, when nbconvert is in the image: it is with
jupyterlab, whose jupyter_server needs it), ``job.log`` (papermill's log with the cells'
output). On standard output, between the markers of :mod:`gpuspawner.jobs.model`, the result
for the hub: base64 lines of zlib-compressed JSON ``{"notebook": ..., "error": ..., "html":
...}`` (``html`` is null when there is none or it is larger than
``GPUSPAWNER_JOB_MAX_HTML_BYTES``, default 16 MiB: it stays in the folder then).

Standard error is standard output (``dup2``): the log lines (these, papermill's, the cells'
output papermill logs, the kernel's own messages) and the result reach the hub in one stream
in their order, which the hub reads as the job's log (``GET api/jobs/{id}/log``).

Exit status: 0 done, 1 a cell raised, 2 anything else (no kernel, papermill missing, ...),
143 terminated (SIGTERM: time limit or cancel).
"""

from __future__ import annotations

import base64
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


def emit(result: dict[str, object]) -> None:
    """The result, framed, on standard output."""
    data = base64.b64encode(zlib.compress(json.dumps(result).encode("utf-8"), 9)).decode()
    sys.stdout.write(BEGIN + "\n" + "\n".join(textwrap.wrap(data, 76)) + "\n" + END + "\n")
    sys.stdout.flush()


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
    home = env.get("HOME") or os.getcwd()
    name = env.get("GPUSPAWNER_JOB_NAME") or "notebook"
    folder = os.path.join(home, env["GPUSPAWNER_JOB_OUTPUT_DIR"])
    os.makedirs(folder, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        handlers=[logging.FileHandler(os.path.join(folder, "job.log")),
                                  logging.StreamHandler(sys.stderr)])
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
                                          "cell": None}})
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
        if notebook is not None else None
    max_html = int(env.get("GPUSPAWNER_JOB_MAX_HTML_BYTES") or MAX_HTML_BYTES)
    if html is not None and len(html.encode("utf-8")) > max_html:
        log.warning("the HTML export is larger than %d bytes: it stays in %s only", max_html,
                    folder)
        html = None
    emit({"notebook": notebook, "error": error, "html": html})
    log.info("job %s: done, exit status %d", name, code)
    return code


def main() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(1, 2)  # one stream, in order: the log and the result (the module's docstring)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = run(dict(os.environ))
    except Terminated:
        log.error("terminated (time limit or cancel)")
        code = 143
    logging.shutdown()
    sys.exit(code)


if __name__ == "__main__":
    main()
