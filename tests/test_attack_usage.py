"""Hostile review of this round's surfaces, as another user with real tokens: each test replays
an attack of one user on another's data or servers.

- ``api/usage`` (reports, CSV), ``api/usage/budgets``, ``api/users/<name>/usage`` (with its
  ``gpu_share_notices``) and ``api/queue`` (``fairshare_factor``) in pytest-jupyterhub's
  in-process hub with the gpuspawner service on loopback (tests/test_usage_budgets_hub.py's
  hub): bob's own token asks for ann's figures every way the handlers parse a name.
- MPS daemons run by gpuspawner (``gpu_share: mps-daemon``) on the real Docker engine with the
  stand-in daemon of tests/test_gpu_share_mps.py (no GPU here): a client and the daemon's
  pipes and logs, and another user's server on the same GPU (refused).

A finding that still works is an ``xfail(strict=True)`` naming it: it turns into a failure (to
be made a plain test) once the hole is closed.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from datetime import timezone
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest
from jupyterhub import orm
from tornado.httpclient import AsyncHTTPClient

import tests.inprocess_hub as inprocess_hub_module
import tests.test_usage_budgets_hub as budgets_hub_module
from gpuspawner.gpushare.mps import PIPE_MOUNT
from gpuspawner.testing.inprocess import wait_for
from gpuspawner.usage.api import usage_routes
from gpuspawner.usage.budgets import parse_budgets, period_bounds
from gpuspawner.usage.pages import usage_page_routes
from gpuspawner.usage.store import UsageStore
from tests.test_gpu_share import engine, spawner  # noqa: F401 (fixtures)
from tests.test_gpu_share_mps import STAND_IN, daemons, no_daemons  # noqa: F401
from tests.test_jobs_runner import submit, until
from tests.test_jobs_runner import world as jobs_world
from tests.test_spawner_inprocess import PROFILES, api, start, stopped
from tests.test_usage_budgets_hub import ZONE, budget_hub  # noqa: F401
from tests.test_usage_fairshare_hub import QUEUED, spawn
from tests.test_usage_hub import recorder, runtime, token_of


def run_in(engine, cid: str, *cmd: str) -> tuple[int, str]:  # noqa: F811
    """``cmd`` run in container ``cid`` as the container's user (what the server's owner
    runs in a terminal): (exit status, output)."""
    ex = engine.exec_create(cid, list(cmd))
    out = engine.exec_start(ex).decode(errors="replace")
    return engine.exec_inspect(ex["Id"])["ExitCode"], out


@pytest.fixture
async def mps_client(no_daemons, spawner, engine):  # noqa: F811
    """A server of gsatka, a quarter share of one GPU under gpuspawner's MPS daemon (another
    user's share is refused there: test_another_users_server_never_joins_a_gpus_mps_clients).
    Returns its container id."""
    sp = spawner("gsatka", node={"gpu_share": "mps-daemon"})
    backend = sp.cluster.backend
    backend.mps_daemon_command = STAND_IN
    backend.stop_timeout = 1  # the stand-in server ignores SIGTERM (pid 1)
    await asyncio.wait_for(sp.start(), 90)
    assert len(daemons(engine)) == 1
    yield sp.backend_state["container_id"]
    await sp.stop()


@pytest.mark.docker
async def test_mps_client_cannot_touch_the_daemons_pipes_or_read_its_logs(
        mps_client, engine):  # noqa: F811
    """Held: the pipe volume is root's (a client can neither remove the daemon's control pipe
    nor plant a file beside it), and the daemon's logs (every client's uid and pid) are not
    mounted in a client."""
    cid = mps_client
    code, out = run_in(engine, cid, "sh", "-c", f"rm -f {PIPE_MOUNT}/control; "
                       f"touch {PIPE_MOUNT}/planted")
    assert code != 0 and out.count("Permission denied") == 2, out
    _, out = run_in(engine, cid, "ls", PIPE_MOUNT)
    assert out.split() == ["control"], out
    code, out = run_in(engine, cid, "ls", "/var/log/nvidia-mps")
    assert code != 0, out  # the log volume: the daemon's only


@pytest.mark.docker
async def test_another_users_server_never_joins_a_gpus_mps_clients(
        no_daemons, spawner, engine):  # noqa: F811
    """Fixed: MPS clients of one GPU share the daemon's IPC namespace (IpcMode
    container:<daemon>), so one /dev/shm and the System V IPC objects: at the default uid bob
    listed and read a 0600 POSIX shared memory segment of ann's (a DataLoader's tensors), saw
    her System V segment, and could fill the 64 MiB /dev/shm so that her shared memory failed
    with ENOSPC. Now another user's share on a GPU whose MPS daemon serves ann's server is
    refused (docs/gpu-sharing.md, MPS) and none of bob's containers joins her namespace.
    The placement keeps his share off her GPU (it starts on the other one:
    tests/test_gpu_share_mps.py); here its rule is off, as a placement that put him there,
    so that the start-time check, kept as defence in depth, is what refuses."""
    ann = spawner("gsatka", node={"gpu_share": "mps-daemon"})
    bob = spawner("gsatkb", node={"gpu_share": "mps-daemon"})
    backend = ann.cluster.backend
    backend.mps_daemon_command = STAND_IN
    backend.stop_timeout = 1
    ann.cluster.ledger.set_one_user_shares([])
    await asyncio.wait_for(ann.start(), 90)
    try:
        (daemon,) = daemons(engine)
        with pytest.raises(Exception, match="for another user's server"):
            await asyncio.wait_for(bob.start(), 90)
        joined = [c for c in engine.containers(all=True)
                  if engine.inspect_container(c["Id"])["HostConfig"]["IpcMode"]
                  == f"container:{daemon['Id']}"]
        assert [c["Labels"].get("gpuspawner.user") for c in joined] == ["gsatka"]
        assert ann.cluster.ledger.find("gsatkb", "") is None  # bob's GPU share released
    finally:
        await ann.stop()


# ------------------------------------------------------------------ the in-process hub
@pytest.fixture
def attack_hub(monkeypatch, request):
    """tests/test_usage_budgets_hub.py's hub (10 GPU-hours a month each, the service's
    ``api/usage`` routes) with a queueing 2-GPU profile beside its profiles."""
    monkeypatch.setattr(budgets_hub_module, "PROFILES", [*PROFILES, QUEUED])
    return request.getfixturevalue("budget_hub")


def booked(app, user: str, gpu_hours: float, groups: list[str], name: str) -> None:
    """A closed record of ``gpu_hours`` of ``user``'s in ``groups``, the last minute."""
    now = time.time()
    start_, _ = period_bounds("month", now, ZoneInfo(ZONE))
    begin = max(start_, now - 60.0)
    store = recorder(app).store
    rid = store.open({"allocation_id": secrets.token_hex(8), "user": user, "groups": groups,
                      "kind": "server", "name": name, "node": budgets_hub_module.NODE,
                      "profile": "a100-1", "gpu_milli": round(
                          gpu_hours * 3600 * 1000 / (now - begin)),
                      "cpu_milli": 1000, "started": begin})
    store.close(rid, now)


async def get(url: str, token: str) -> tuple[int, str]:
    r = await AsyncHTTPClient().fetch(url, headers={"Authorization": f"token {token}"},
                                      raise_error=False)
    return r.code, r.body.decode(errors="replace")


async def test_another_users_token_reads_none_of_anns_usage(attack_hub):
    """bob (same group as ann) asks api/usage, api/usage/budgets and api/users/ann/usage for
    ann's figures every way the handlers read a name: refused, or his own rows only."""
    app, url = attack_hub
    ann, bob = [await token_of(app, u) for u in ("ann", "bob")]
    for u in ("ann", "bob"):
        orm_user = orm.User.find(app.db, u)
        group = orm.Group.find(app.db, "physics") or orm.Group(name="physics")
        app.db.add(group)
        group.users.append(orm_user)
    app.db.commit()
    booked(app, "ann", 3.25, ["physics"], "ann-private-server")
    booked(app, "bob", 1.0, ["physics"], "bobs")
    refused = ["api/usage?user=ann", "api/usage?user=ANN", "api/usage?user=bob&user=ann",
               "api/usage?user=ann&user=bob", "api/usage?user=%61nn",
               "api/usage/budgets?user=ann", "api/usage/budgets?user=bob&user=ann",
               "api/users/ann/usage", "api/users/%61nn/usage", "api/users/ANN/usage"]
    for path in refused:
        code, body = await get(url + path, bob)
        assert code in (400, 403), (path, code, body)
        assert "3.25" not in body and "ann-private" not in body, (path, body)
    own = ["api/usage", "api/usage?user=", "api/usage?group_by=user",
           "api/usage?group_by=group", "api/usage?group_by=group,profile,node",
           "api/usage?group_by=day", "api/usage?format=csv", "api/usage?format=csv&"
           "group_by=user,group", "api/usage?user=bob&group_by=group",
           "api/usage/budgets", "api/usage/budgets?user=", "api/users/bob/usage"]
    for path in own:
        code, body = await get(url + path, bob)
        assert code == 200, (path, code, body)
        assert "ann" not in body and "3.25" not in body and "4.25" not in body, (path, body)
    # a time zone name longer than a file name may be: a 400 naming tz (was an HTTP 500)
    code, body = await get(url + "api/usage?tz=" + "a" * 300, bob)
    assert code == 400 and json.loads(body)["message"].startswith("tz: unknown time zone"), body
    code, body = await get(url + "api/usage?group_by=group", bob)
    [row] = json.loads(body)["rows"]
    assert row["group"] == "physics" and row["gpu_hours"] == pytest.approx(1.0, abs=0.01)
    # ann reads her own; the service's admin reads both
    code, body = await get(url + "api/usage?group_by=user", ann)
    assert code == 200 and "bob" not in body, body
    root = await token_of(app, "admin")
    code, body = await get(url + "api/usage?group_by=user", root)
    assert code == 200 and {r["user"] for r in json.loads(body)["rows"]} == {"ann", "bob"}


async def queue_behind_holder(app, user: str, token: str) -> asyncio.Future:
    """holder takes both GPUs; ``user`` asks for the queueing 2-GPU profile with their own
    token and waits. Returns the spawn request (its HTTP status once answered)."""
    r = await start(app, "holder", "", {"profile": "a100-2"})
    assert r.status_code in (201, 202), r.text
    q = runtime(app).queue
    wait = asyncio.ensure_future(spawn(app, user, token))
    await wait_for(lambda: len(q.wq) == 1 or wait.done(), 20, message=f"{user} waits")
    assert not wait.done(), wait.result()
    return wait


async def test_the_queue_shows_another_user_no_entry_of_anns(attack_hub):
    app, url = attack_hub
    ann, bob = [await token_of(app, u) for u in ("ann", "bob")]
    await token_of(app, "holder")
    booked(app, "ann", 5.0, [], "earlier")
    wait = await queue_behind_holder(app, "ann", ann)
    await runtime(app)._fairshare.refresh()  # type: ignore[attr-defined]
    for token, mine in ((bob, []), (ann, ["ann"])):
        code, body = await get(url + "api/queue", token)
        doc = json.loads(body)
        assert code == 200 and doc["length"] == 1, body
        assert [e["user"] for e in doc["entries"]] == mine, body
    assert "ann" not in (await get(url + "api/queue", bob))[1]
    r = await api(app, "delete", "users", "ann", "server")  # cancel her wait
    assert r.status_code in (202, 204), r.text
    await asyncio.wait_for(wait, 30)
    r = await api(app, "delete", "users", "holder", "server")
    assert r.status_code in (202, 204), r.text
    await stopped(app, "holder")


async def test_a_spawn_waiting_in_the_queue_is_refused_once_the_budget_is_used_up(attack_hub):
    """ann asks while under her budget (9 of 10 GPU-hours) and waits in the queue; meanwhile
    her budget is used up (her other servers' records close). When the GPUs come free the
    waiting spawn is a start past a used-up budget: refused, nothing booked for her."""
    app, _ = attack_hub
    ann = await token_of(app, "ann")
    await token_of(app, "holder")
    booked(app, "ann", 9.0, [], "earlier")
    wait = await queue_behind_holder(app, "ann", ann)
    booked(app, "ann", 2.0, [], "meanwhile")  # 11 of 10 now
    r = await api(app, "delete", "users", "holder", "server")
    assert r.status_code in (202, 204), r.text
    await stopped(app, "holder")
    sp = app.users["ann"].spawners[""]
    await wait_for(lambda: not sp.pending, 30, message="ann's spawn decided")
    await asyncio.wait_for(wait, 30)
    assert not sp.ready
    assert [a.owner.user for a in runtime(app).ledger.allocations()] == []


world = jobs_world  # the jobs runner on a backend double, two nodes of two GPUs


async def test_a_job_waiting_in_the_queue_does_not_start_once_the_budget_is_used_up(
        world, tmp_path):
    """The jobs runner's form of the queue dodge: ann's job is checked when it is submitted
    (4 of 5 GPU-hours: passes) and waits for a GPU; her budget runs out meanwhile; when a GPU
    comes free her job fails naming the budget instead of starting."""
    runner, cluster, jobs = world
    store = UsageStore(f"sqlite:///{tmp_path}/u.sqlite")
    try:
        cluster.usage = SimpleNamespace(store=store)
        cluster.usage_budgets = parse_budgets({"default": {"period": "month", "gpu_hours": 5}})
        holders = [await submit(runner, u) for u in ("h1", "h1", "h1", "h2")]  # all 4 GPUs
        await until(lambda: len(jobs.running()) == 4)
        now = time.time()
        start_, _ = period_bounds("month", now, timezone.utc)
        begin = max(start_, now - 60)

        def used(name: str, hours: float) -> None:
            rid = store.open({"allocation_id": name, "user": "ann", "groups": [],
                              "kind": "server", "name": name, "node": "n1",
                              "gpu_milli": round(hours * 3600 * 1000 / (now - begin)),
                              "cpu_milli": 1000, "started": begin})
            store.close(rid, now)

        used("before", 4.0)
        row = await submit(runner, "ann")  # 4 of 5: passes, waits for a GPU
        await until(lambda: row.state == "waiting")
        used("meanwhile", 2.0)  # 6 of 5 now
        jobs.finish(jobs.running()[0])  # a GPU comes free
        await until(lambda: row.state in ("failed", "starting", "running"))
        assert row.state == "failed", (row.state, row.message)
        assert row.message.startswith("not started: usage budget 'default' is used up: 6 of "
                                      "5 GPU-hours"), row.message
        assert jobs.made == 4 and all(a.owner.user != "ann"
                                        for a in cluster.ledger.allocations())
        assert holders[0].user == "h1"
    finally:
        store.close_store()


def with_page(prefix: str, kw: dict) -> list:
    return [*usage_routes(prefix, kw), *usage_page_routes(prefix, kw)]


@pytest.fixture
def page_hub(monkeypatch, request):
    """tests/test_usage_budgets_hub.py's hub whose service also serves the usage page."""
    monkeypatch.setattr(inprocess_hub_module, "usage_routes", with_page)
    return request.getfixturevalue("budget_hub")


async def test_the_usage_page_escapes_names_and_refuses_users(page_hub):
    """The admins' usage page (services/gpuspawner/usage) renders user and group names from
    the records (an authenticator's name, an LDAP group) in HTML, SVG titles and data
    attributes: markup in them stays text. A user's own token is refused it."""
    app, url = page_hub
    bob, root = [await token_of(app, u) for u in ("bob", "admin")]
    user = '"><svg onload=alert(1)>'
    group = "</title><script>alert(2)</script>"
    booked(app, user, 2.0, [group], "x")
    code, body = await get(url + "usage", bob)
    assert code == 403 and user not in body, body
    code, body = await get(url + "usage?tz=" + "%3Cscript%3E", root)
    assert code == 400 and "<script>" not in body, body
    code, body = await get(url + "usage", root)
    assert code == 200, body
    for raw in (user, group, "<svg onload", "<script>alert"):
        assert raw not in body, raw
    assert "&lt;svg onload=alert(1)&gt;" in body and "&lt;script&gt;alert(2)" in body
