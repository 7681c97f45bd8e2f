"""The demo's admin with the demo authenticator (the other side of
``tests/test_ldap_hub.py::test_the_demo_admin_is_no_admin_with_ldap``): the shipped
configuration as it is makes ``admin`` a hub admin with the gpuspawner service's admin role,
the idle culler exempts it (``--exempt-users``, source ``cli``) and nobody else, and the
start-up log names it (gpuspawner/hub/demo.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from gpuspawner.testing.hubrunner import Hub
from gpuspawner.testing.waiting import wait_until
from tests.test_hub_e2e import _engine
from tests.test_service_hub import EXTRA_ADMIN_SCOPES

pytestmark = [pytest.mark.docker, pytest.mark.hub]


def test_the_demo_admin_is_admin_and_exempt_with_the_demo_authenticator(tmp_path: Path):
    _engine()
    hub = Hub(tmp_path / "hub", [{"name": "local", "topology": "auto"}],
              [{"slug": "cpu", "cpu": 1, "memory": "256M", "default": True}],
              extra_config=EXTRA_ADMIN_SCOPES)
    hub.start()
    try:
        model = hub.api("GET", "/users/admin").json()
        assert model["admin"] is True
        assert "gpuspawner-service-admins" in model["roles"], model["roles"]
        log = hub.log_path.read_text(errors="replace")
        assert "hub admins named in the configuration (DummyAuthenticator): admin" in log
        assert "hub admins: admin" in log

        def policy(user: str) -> dict | None:
            url = f"{hub.url}/services/idle-culler/api/policy?user={user}"
            try:
                r = requests.get(url, headers={"Authorization": f"token {hub.token}"},
                                 timeout=10)
            except requests.RequestException:
                return None
            return r.json()["policy"] if r.status_code == 200 else None

        pol = wait_until(lambda: policy("admin"), 60, 0.5, "the culler's policy API answers")
        assert pol["exempt"] == {"value": True, "source": "cli"}
        assert policy("someone")["exempt"]["value"] is False
    finally:
        hub.stop()
