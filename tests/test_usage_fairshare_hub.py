"""Fair share over time and the usage counters (issue 41, items 5 and 6) in pytest-jupyterhub's
in-process hub (tests/test_usage_hub.py's: the hub's own application, REST API and database,
GPUSpawner on the fake engine, the gpuspawner service's application asking that hub who calls):

- a server's interval closes: the service's ``metrics`` say its GPU- and core-seconds grew by
  the record's seconds (within 2 %), by group and profile, with no user label (and the
  reserved GPU-seconds grew while it ran);
- two users wait for two GPUs while a third holds them; the one who came first used GPUs a
  moment ago, the other never did: ``api/queue`` puts the second first and says each factor
  (a user's token sees only the user's own entry), and when the holder stops the second
  starts while the first keeps waiting.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from urllib.parse import quote

import pytest
from tornado.httpclient import AsyncHTTPClient

import tests.test_usage_hub as usage_hub_module
from gpuspawner.testing.inprocess import wait_for
from tests.test_spawner_inprocess import PROFILES, api, start, stopped
from tests.test_usage_hub import recorder, runtime, token_of, usage_hub  # noqa: F401

#: a 2-GPU profile that waits in the queue when the GPUs are taken
QUEUED = {"slug": "a100-2q", "display_name": "2 x A100, waits", "cpu": 1, "memory": "1G",
          "gpus": 2, "gpu_models": ["A100"], "queue": True}


@pytest.fixture
def fair_hub(monkeypatch, request):
    """tests/test_usage_hub.py's hub with a queueing 2-GPU profile beside its profiles."""
    monkeypatch.setattr(usage_hub_module, "PROFILES", [*PROFILES, QUEUED])
    return request.getfixturevalue("usage_hub")


async def fetch(url: str, token: str) -> tuple[int, str]:
    r = await AsyncHTTPClient().fetch(url, headers={"Authorization": f"token {token}"},
                                      raise_error=False)
    return r.code, r.body.decode()


async def spawn(app, user: str, token: str) -> int:
    """``POST users/{user}/server`` of the queueing profile with the user's own token (the
    test harness's API helper runs one request at a time: a waiting spawn would block it)."""
    url = quote(f"{app.hub.url.rstrip('/')}/api/users/{user}/server", safe=":/@%")
    r = await AsyncHTTPClient().fetch(
        url, method="POST",
        body=json.dumps({"profile": QUEUED["slug"]}),
        headers={"Authorization": f"token {token}"}, raise_error=False, request_timeout=60)
    return r.code


def counter(text: str, name: str, group: str, profile: str) -> float:
    """One sample of the Prometheus text (0 when absent)."""
    m = re.search(rf'^{name}{{group="{re.escape(group)}",profile="{re.escape(profile)}"}} '
                  r"(\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def test_a_closed_server_interval_grows_the_usage_counters(fair_hub):
    app, url = fair_hub
    admin = await token_of(app, "admin")
    await token_of(app, "ann")
    code, before = await fetch(url + "metrics", admin)
    assert code == 200, before
    r = await start(app, "ann", "", {"profile": "a100-1"})
    assert r.status_code in (201, 202), r.text
    t0 = time.monotonic()
    await wait_for(lambda: time.monotonic() - t0 >= 2.0, 10, message="2 s held")
    code, running = await fetch(url + "metrics", admin)  # it grows while the server runs
    name = "gpuspawner_usage_reserved_gpu_seconds_total"
    assert code == 200 and counter(running, name, "-", "a100-1") - counter(
        before, name, "-", "a100-1") >= 2.0 * 0.98, running
    r = await api(app, "delete", "users", "ann", "server")
    assert r.status_code in (202, 204), r.text
    await stopped(app, "ann")
    [row] = recorder(app).store.records()
    seconds = row.ended - row.started
    assert seconds >= 2.0
    code, after = await fetch(url + "metrics", admin)
    assert code == 200, after
    for name, per_second in (("gpuspawner_usage_reserved_gpu_seconds_total", 1.0),
                             ("gpuspawner_usage_reserved_core_seconds_total", 2.0)):
        grew = counter(after, name, "-", "a100-1") - counter(before, name, "-", "a100-1")
        assert grew == pytest.approx(per_second * seconds, rel=0.02), (name, after)
    assert "# TYPE gpuspawner_usage_reserved_gpu_seconds_total counter" in after
    assert 'user="ann"' not in after  # no user label by default


async def test_past_usage_puts_a_later_user_first_and_the_queue_says_each_factor(fair_hub):
    app, url = fair_hub
    admin = await token_of(app, "admin")
    tokens = {u: await token_of(app, u) for u in ("heavy", "light", "holder")}
    cluster = runtime(app)
    feed = cluster._fairshare  # type: ignore[attr-defined]
    # heavy used both GPUs a moment ago
    r = await start(app, "heavy", "old", {"profile": "a100-2"})
    assert r.status_code in (201, 202), r.text
    # the hub started the feed once it restored what runs (on by default: 7 days' half-life);
    # it reads nothing while nobody waits
    await wait_for(lambda: feed._task is not None, 10, message="the feed's start")
    assert feed.refreshes == 0
    r = await api(app, "delete", "users", "heavy", "servers", "old")
    assert r.status_code in (202, 204), r.text
    await stopped(app, "heavy", "old")
    r = await start(app, "holder", "", {"profile": "a100-2"})  # holds both GPUs
    assert r.status_code in (201, 202), r.text
    q = cluster.queue
    waits = [asyncio.ensure_future(spawn(app, "heavy", tokens["heavy"]))]
    await wait_for(lambda: len(q.wq) == 1 or waits[0].done(), 20, message="heavy waits")
    assert not waits[0].done(), waits[0].result()
    await wait_for(lambda: len(q.wq) == 1, 20, message="heavy waits")
    # someone waits: the hub's own feed refreshes within its 5 s gap
    await wait_for(lambda: feed.refreshes >= 1, 10, message="the feed's first refresh")
    waits.append(asyncio.ensure_future(spawn(app, "light", tokens["light"])))
    await wait_for(lambda: len(q.wq) == 2, 20, message="light waits")
    past = await feed.refresh()  # (the hub does this every minute and when a record closes)
    assert past["heavy"] > 0 and "light" not in past
    code, body = await fetch(url + "api/queue", admin)
    assert code == 200, body
    entries = {e["user"]: e for e in json.loads(body)["entries"]}
    assert (entries["light"]["position"], entries["heavy"]["position"]) == (1, 2)
    assert entries["light"]["fairshare_factor"] == 1.0
    assert 0 < entries["heavy"]["fairshare_factor"] < 1
    code, body = await fetch(url + "api/queue", tokens["light"])  # only light's own entry
    assert code == 200 and [e["user"] for e in json.loads(body)["entries"]] == ["light"]
    r = await api(app, "delete", "users", "holder", "server")
    assert r.status_code in (202, 204), r.text
    await stopped(app, "holder")
    await wait_for(lambda: app.users["light"].spawners[""].ready, 20, message="light ready")
    assert not app.users["heavy"].spawners[""].ready and len(q.wq) == 1
    r = await api(app, "delete", "users", "heavy", "server")  # cancel heavy's wait
    assert r.status_code in (202, 204), r.text
    for w in waits:
        await asyncio.wait_for(w, 30)
