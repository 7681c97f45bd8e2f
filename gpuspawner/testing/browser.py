"""Steps the real-browser tests share (playwright pages against a running hub)."""

from __future__ import annotations

from typing import Any

__all__ = ["hub_login"]


def hub_login(page: Any, hub_url: str, user: str, password: str = "gpuspawner") -> None:
    """Log ``user`` in on JupyterHub's login page at ``hub_url`` (``http://host:port``, no
    trailing slash) through its form (``#username_input``, ``#password_input``,
    ``#login_submit``) and wait until the page has left it (home, spawn page or the server).

    ``page``: a playwright ``Page``; ``password``: the demo authenticator's shared password
    (``gpuspawner.hub.demo``) unless the hub uses another.

    Raises:
        playwright's TimeoutError: the page is still on the login page after the page's
            default timeout (wrong password, hub not answering).
    """
    page.goto(f"{hub_url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_url(lambda url: "/hub/login" not in url)
