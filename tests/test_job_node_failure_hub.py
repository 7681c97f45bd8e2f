"""A notebook job whose node fails is retried on the other node, through the real hub, proxy
and two real Docker engines: node a (the local engine behind a socket the test cuts) stops
answering while the job runs; after ``c.GPUJobs.lost_after`` the job is ``lost``, its booking
on a is released, and it runs again from its first cell on node b (the btrfs engine), where
it completes; both attempts keep their folders in the user's home. Docs: docs/jobs.md
("Faults")."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

docker = pytest.importorskip("docker")
nbformat = pytest.importorskip("nbformat")

from gpuspawner.hub.identity import safe_name  # noqa: E402
from gpuspawner.testing.hubrunner import Hub  # noqa: E402
from gpuspawner.testing.waiting import wait_until  # noqa: E402
from tests.test_hub_e2e import remove_objects_of  # noqa: E402
from tests.test_jobs_hub import EXTRA, User, admin_allocations  # noqa: E402
from tests.test_jobs_units import notebook  # noqa: E402
from tests.test_node_failure_hub import node_pair  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]
USER = "jn-mover"


def test_a_job_on_a_failed_node_is_lost_then_completes_on_the_other(tmp_path: Path):
    engine, btrfs, fwd, nodes = node_pair(tmp_path)
    profiles = [{"slug": "cpu", "cpu": 1, "memory": "512M", "default": True}]
    extra = EXTRA.replace('c.GPUSpawner.quotas = {"users": {"jb-quota": {"servers": 1}}}\n', "")
    hub = Hub(tmp_path / "hub", nodes, profiles, extra_config=extra + (
        "c.GPUSpawner.placement_policy = 'first-fit'\n"
        "c.GPUJobs.lost_after = 3\n"
        "c.GPUJobs.retry_backoff = 1\n"))
    hub.env["GPUSPAWNER_CULLER"] = "off"
    hub.start()
    try:
        u = User(hub, USER)
        job = u.submit(notebook("import time\ntime.sleep(6)\nprint('made it')"),
                       name="mover", max_retries=2)
        running = u.wait_state(job["id"], ("running",), 120)
        assert running["node"] == "a", running
        wait_until(lambda: "executing" in u.call("GET", f"api/jobs/{job['id']}/log").text,
                   60, 0.3, "the job's program started")
        fwd.fail()  # node a's engine stops answering
        t0 = time.monotonic()
        again = wait_until(lambda: (lambda j: j if j["attempt"] == 2 and j["state"] == "running"
                                    else None)(u.job(job["id"])), 120, 0.3,
                           lambda: f"{u.job(job['id'])}\n{hub.tail(40)}")
        print(f"node a failed -> the job runs again on node b: {time.monotonic() - t0:.1f} s")
        assert again["node"] == "b", again
        (lost,) = again["attempts"]
        assert lost["state"] == "lost" and lost["node"] == "a", lost
        assert "does not answer" in lost["message"] or "has not answered" in lost["message"], lost
        done = u.wait_state(job["id"], ("completed", "failed", "lost", "timed_out"), 120)
        assert done["state"] == "completed" and done["node"] == "b", done
        # the booking on a was released at the loss: nothing of this user is booked now
        wait_until(lambda: not admin_allocations(hub, USER), 30, 0.3, "released")
        # each attempt has its folder; the second holds the executed notebook
        home = hub.state_dir / "home" / safe_name(USER)
        one, two = home / lost["output_dir"][2:], home / done["output_dir"][2:]
        assert one != two and (one / "mover.input.ipynb").is_file()
        nb = json.loads((two / "mover.ipynb").read_text())
        assert "made it\n" in ["".join(o.get("text", "")) for c in nb["cells"]
                               for o in c.get("outputs", [])]
    finally:
        hub.stop()
        try:
            fwd.fail()
        except Exception:
            pass
        remove_objects_of(engine, [USER])
        remove_objects_of(btrfs, [USER])
