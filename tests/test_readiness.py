"""gpuspawner.hub.readiness.wait_for_own_server against a real listener on loopback: the
server's answer counts only while the backend says it runs, and the backend is asked at most
every ``exit_check_s`` seconds while nothing answers (no engine call per round)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpuspawner.hub.readiness import wait_for_own_server


class Api(web.RequestHandler):
    def initialize(self, body: str) -> None:
        self.body = body

    def get(self) -> None:
        self.write(self.body)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def server():
    """Start a Jupyter-like ``/user/a/api`` on loopback; yields a function returning its port.
    """
    servers: list[HTTPServer] = []

    def start(body: str = '{"version": "2.0.0"}') -> int:
        app = web.Application([(r"/user/a/api", Api, {"body": body})])
        socks = bind_sockets(0, "127.0.0.1")  # non-blocking, as tornado needs
        srv = HTTPServer(app)
        srv.add_sockets(socks)
        servers.append(srv)
        return socks[0].getsockname()[1]

    yield start
    for srv in servers:
        srv.stop()


class Exits:
    """An ``exited`` callback that records when it was asked, answering ``report`` from call
    number ``gone_from`` on (None before)."""

    def __init__(self, report: str | None = None, gone_from: int = 1) -> None:
        self.report, self.gone_from = report, gone_from
        self.calls: list[float] = []

    async def __call__(self) -> str | None:
        self.calls.append(asyncio.get_running_loop().time())
        return self.report if len(self.calls) >= self.gone_from else None


async def test_ready_when_it_answers_and_runs(server) -> None:
    port = server()
    exits = Exits()
    await wait_for_own_server("127.0.0.1", port, "/user/a/", exited=exits, timeout=5)
    assert len(exits.calls) == 2  # before the first request and after the answer


async def test_an_answer_from_a_server_that_is_gone_is_not_ready(server) -> None:
    port = server()
    exits = Exits("container abc exited during start with code 1", gone_from=2)
    with pytest.raises(web.HTTPError) as e:
        await wait_for_own_server("127.0.0.1", port, "/user/a/", exited=exits, timeout=5)
    assert e.value.status_code == 500
    assert "exited during start" in e.value.log_message


async def test_backend_asked_once_a_second_while_nothing_answers() -> None:
    exits = Exits()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(web.HTTPError) as e:
        await wait_for_own_server("127.0.0.1", closed_port(), "/user/a/", exited=exits,
                                  timeout=2.2, exit_check_s=1.0)
    assert "did not answer within 2.2 s" in e.value.log_message
    assert "Connect" in e.value.log_message or "refused" in e.value.log_message.lower()
    # about 10 rounds in 2.2 s; the backend: the first round, ~1 s, ~2 s, and at the deadline
    assert 3 <= len(exits.calls) <= 4, [round(t - t0, 2) for t in exits.calls]
    gaps = [b - a for a, b in zip(exits.calls[:2], exits.calls[1:3], strict=True)]
    assert all(g >= 1.0 for g in gaps), gaps


async def test_a_server_that_exits_fails_within_the_check_interval() -> None:
    exits = Exits("container abc exited during start with code 3", gone_from=2)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(web.HTTPError) as e:
        await wait_for_own_server("127.0.0.1", closed_port(), "/user/a/", exited=exits,
                                  timeout=30, exit_check_s=0.5)
    assert "code 3" in e.value.log_message
    assert loop.time() - t0 < 2.0


async def test_a_listener_that_is_no_jupyter_server_never_counts(server) -> None:
    port = server('{"hello": "world"}')
    exits = Exits()
    with pytest.raises(web.HTTPError) as e:
        await wait_for_own_server("127.0.0.1", port, "/user/a/", exited=exits, timeout=1)
    assert "without a Jupyter server version" in e.value.log_message
