"""Usage records across a real hub restart (JupyterHub + configurable-http-proxy + GPUSpawner
on the real Docker engine; marked ``docker`` and ``hub``): two servers run; the hub stops; one
container is removed while it is down; at the next start the running server keeps its record
(same id, still open) and the removed one's record is closed with ``closed_at_restart``; a stop
then closes the running one. ``api/usage`` through the proxy (an admin's token, a user's
token) and ``gpuspawner usage`` on the database report the same records."""

from __future__ import annotations

import csv
import io
import time

import pytest

docker = pytest.importorskip("docker")

from gpuspawner.cli import main as cli_main  # noqa: E402
from gpuspawner.usage.store import UsageStore  # noqa: E402
from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import MiB, _engine, containers_of, remove_managed, topology  # noqa: E402
from tests.test_service_hub import EXTRA_ADMIN_SCOPES, svc, user_token  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]


def records(db: str) -> dict[str, object]:
    """The records by user (each user has one here)."""
    store = UsageStore(db, upgrade=False)
    try:
        return {r.user: r for r in store.records()}
    finally:
        store.close_store()


def test_records_survive_a_hub_restart(tmp_path, capsys):
    engine = _engine()
    nodes = [{"name": "tiny", "topology": topology(tmp_path, "tiny", 600 * MiB)}]
    profiles = [{"slug": "tiny", "cpu": 1, "memory": "256M", "nodes": ["tiny"]}]
    hub = Hub(
        tmp_path,
        nodes,
        profiles,
        extra_config="c.GPUSpawner.poll_interval = 2\n" + EXTRA_ADMIN_SCOPES,
    )
    hub.env["GPUSPAWNER_CULLER"] = "off"
    db = f"sqlite:///{tmp_path / 'hub' / 'gpuspawner-usage.sqlite'}"
    hub.start()
    try:
        for user in ("rita", "rob"):
            hub.ensure_user(user)
            r = hub.api("POST", f"/users/{user}/server", {"profile": "tiny"})
            assert r.status_code in (201, 202), r.text
            hub.wait_ready(user)
        before = records(db)
        assert set(before) == {"rita", "rob"}
        assert all(
            r.ended is None
            and r.profile == "tiny"
            and r.cpu_milli == 1000
            and r.memory_bytes == 256 * MiB
            for r in before.values()
        )

        hub.stop()
        (rob,) = containers_of(engine, "rob")
        engine.remove_container(rob["Id"], force=True)  # it ends while the hub is down
        hub.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and records(db)["rob"].ended is None:
            time.sleep(0.5)
        after = records(db)
        assert after["rob"].ended is not None and after["rob"].closed_at_restart
        assert after["rita"].id == before["rita"].id and after["rita"].ended is None
        assert after["rita"].started == before["rita"].started
        assert len(UsageStore(db, upgrade=False).records()) == 2  # no second record

        assert hub.api("DELETE", "/users/rita/server").status_code in (202, 204)
        hub.wait_stopped("rita")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and records(db)["rita"].ended is None:
            time.sleep(0.5)
        done = records(db)["rita"]
        assert done.ended is not None and not done.closed_at_restart

        # the same records through the service (admin: both; rob: his own) and the CLI
        r = svc(hub, "api/usage?group_by=user", hub.token)
        assert r.status_code == 200, r.text
        assert sorted(row["user"] for row in r.json()["rows"]) == ["rita", "rob"]
        r = svc(hub, "api/usage?format=csv", user_token(hub, "rob"))
        assert r.status_code == 200, r.text
        rows = list(csv.DictReader(io.StringIO(r.text)))
        assert [(row["user"], row["closed_at_restart"]) for row in rows] == [("rob", "true")]
        assert svc(hub, "api/usage?user=rita", user_token(hub, "rob")).status_code == 403
        assert (
            cli_main(
                [
                    "usage",
                    "--db",
                    db.removeprefix("sqlite:///"),
                    "--group-by",
                    "user",
                    "--format",
                    "csv",
                ]
            )
            == 0
        )
        table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
        assert sorted(row["user"] for row in table) == ["rita", "rob"]
        assert all(float(row["core_hours"]) > 0 for row in table)
    finally:
        hub.stop()
        remove_managed(engine)
