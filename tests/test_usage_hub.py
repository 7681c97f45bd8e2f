"""Usage records in pytest-jupyterhub's in-process hub (as tests/test_spawner_inprocess.py: the
hub's own application, REST API and database, GPUSpawner on the fake engine), with the
gpuspawner service's Tornado application serving ``api/usage`` and asking that hub who calls
(real JupyterHub tokens, real scopes).

- a spawn through the hub's API opens one record with the allocation's GPU UUIDs, milli-GPU,
  cores and profile; the stop closes it;
- ``GET api/usage``: a user's token reads only the user's own rows (``user=`` another user is a
  403; ``group_by=user`` and ``format=csv`` are filtered to the caller; a parameter given twice
  is a 400), an admin's token reads everyone's; the CSV parses back. The attack is replayed as
  user B asking for A's usage in every form.
"""

from __future__ import annotations

import csv
import io
import json

import pytest
from jupyterhub import orm
from jupyterhub.tests.mocking import MockHub
from tornado.httpclient import AsyncHTTPClient

from gpuspawner.usage.recorder import UsageRecorder
from tests.inprocess_hub import runtime
from tests.test_service_unit import _validate
from tests.test_spawner_inprocess import PROFILES, api, start, stopped

GiB = 1 << 30
NODE = "usage-n1"


@pytest.fixture
async def usage_hub(inprocess_hub):
    """The started in-process hub (one node of two A100s, :data:`PROFILES` as this module
    holds it when the fixture runs) with the gpuspawner service's application serving
    ``api/usage`` on loopback (tests/inprocess_hub.py); ``(app, service URL)``."""
    return await inprocess_hub(NODE, PROFILES, service=True)


def recorder(app: MockHub) -> UsageRecorder:
    found = runtime(app).usage
    assert isinstance(found, UsageRecorder), "the hub attached no usage recorder at start"
    return found


async def token_of(app: MockHub, name: str) -> str:
    """A real API token of hub user ``name`` (made through the hub's API when missing, so it
    has the default ``user`` role), with the user's scopes."""
    if orm.User.find(app.db, name) is None:
        r = await api(app, "post", "users", name)
        assert r.status_code == 201, r.text
    return app.users[orm.User.find(app.db, name)].new_api_token(note="usage test")


async def spawn_and_stop(app: MockHub, user: str, profile: str, server: str = "") -> None:
    r = await start(app, user, server, {"profile": profile})
    assert r.status_code in (201, 202), r.text
    path = ("users", user, "server") if not server else ("users", user, "servers", server)
    r = await api(app, "delete", *path)
    assert r.status_code in (202, 204), r.text
    await stopped(app, user, server)


async def get(url: str, token: str | None, query: str = "") -> tuple[int, str, str]:
    """(status, content type, body) of ``GET api/usage?query`` with ``token``."""
    headers = {"Authorization": f"token {token}"} if token else {}
    r = await AsyncHTTPClient().fetch(
        url + "api/usage" + (f"?{query}" if query else ""), headers=headers, raise_error=False
    )
    return r.code, r.headers.get("Content-Type", ""), r.body.decode()


async def test_a_spawn_then_stop_leaves_one_closed_record(usage_hub):
    app, _ = usage_hub
    rec = recorder(app)
    await token_of(app, "ann")
    r = await start(app, "ann", "", {"profile": "a100-1"})
    assert r.status_code in (201, 202), r.text
    [alloc] = runtime(app).ledger.allocations()
    [row] = rec.store.records()
    assert row.ended is None and row.allocation_id == alloc.id
    assert (row.user, row.kind, row.name, row.profile, row.node) == (
        "ann",
        "server",
        "",
        "a100-1",
        NODE,
    )
    assert row.uuid_list == alloc.gpu_uuids and row.uuid_list[0].startswith(f"GPU-{NODE}-")
    assert (row.gpu_milli, row.cpu_milli, row.memory_bytes, row.gpu_model) == (
        1000,
        2000,
        4 * GiB,
        "A100",
    )
    r = await api(app, "delete", "users", "ann", "server")
    assert r.status_code in (202, 204), r.text
    await stopped(app, "ann")
    [row] = rec.store.records()
    assert row.ended is not None and row.ended >= row.started and not row.closed_at_restart
    assert rec.open_ids == {}


async def test_api_usage_gives_users_their_own_rows_and_admins_all(usage_hub):
    app, url = usage_hub
    ann, root = await token_of(app, "ann"), await token_of(app, "admin")
    await token_of(app, "bob")
    await spawn_and_stop(app, "ann", "a100-1")
    await spawn_and_stop(app, "bob", "a100-2", "big")
    await spawn_and_stop(app, "bob", "cpu")

    code, _, body = await get(url, None)
    assert code in (401, 403), body
    code, kind, body = await get(url, ann)
    assert code == 200 and kind.startswith("application/json"), body
    _validate(json.loads(body), "UsageReport")  # the OpenAPI document's schema
    rows = json.loads(body)["rows"]
    assert [(r["user"], r["profile"]) for r in rows] == [("ann", "a100-1")]
    assert rows[0]["gpu_milli"] == 1000 and len(rows[0]["gpu_uuids"]) == 1

    code, _, body = await get(url, root)
    assert code == 200, body
    assert sorted((r["user"], r["name"]) for r in json.loads(body)["rows"]) == [
        ("ann", ""),
        ("bob", ""),
        ("bob", "big"),
    ]
    code, _, body = await get(url, root, "user=bob&group_by=user")
    assert code == 200, body
    _validate(json.loads(body), "UsageReport")
    [row] = json.loads(body)["rows"]
    assert row["user"] == "bob" and row["intervals"] == 2
    code, kind, body = await get(url, root, "group_by=user,profile&format=csv")
    assert code == 200 and kind.startswith("text/csv"), body
    table = list(csv.DictReader(io.StringIO(body)))
    assert sorted((r["user"], r["profile"]) for r in table) == [
        ("ann", "a100-1"),
        ("bob", "a100-2"),
        ("bob", "cpu"),
    ]
    assert all(float(r["gpu_hours"]) >= 0 for r in table)

    code, _, body = await get(url, ann, "group_by=colour")
    assert code == 400 and json.loads(body)["message"].startswith("group_by: "), body
    code, _, body = await get(url, ann, "from=yesterday")
    assert code == 400 and json.loads(body)["message"].startswith("from: "), body


#: user B (bob) asking for user A's (ann's) usage: every form is refused or filtered
ATTACKS = [
    ("user=ann", 403),
    ("user=ann&format=csv", 403),
    ("user=ann&group_by=user", 403),
    ("user=bob&user=ann", 400),
    ("user=ann&user=bob", 400),
    ("group_by=user", 200),
    ("group_by=group", 200),
    ("group_by=user&format=csv", 200),
    ("format=csv", 200),
    ("user=", 200),
    ("user=ANN", 403),
]


async def test_replayed_attack_user_b_never_reads_user_a(usage_hub):
    app, url = usage_hub
    bob = await token_of(app, "bob")
    await token_of(app, "ann")
    await spawn_and_stop(app, "ann", "a100-2")
    for query, expected in ATTACKS:
        code, kind, body = await get(url, bob, query)
        assert code == expected, (query, code, body)
        assert "ann" not in body.replace("ANN", ""), (query, body)
        if code == 200 and kind.startswith("text/csv"):
            assert len(list(csv.DictReader(io.StringIO(body)))) == 0, (query, body)
        elif code == 200:
            doc = json.loads(body)
            assert doc["rows"] == [] and doc["totals"]["intervals"] == 0, (query, body)
