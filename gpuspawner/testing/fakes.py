"""A stand-in for a JupyterHub user, for a spawner made outside a hub (tests, benchmarks)."""

from __future__ import annotations


class _Group:
    def __init__(self, name: str) -> None:
        self.name = name


class FakeUser:
    """The few attributes of jupyterhub.user.User that a spawner reads outside a hub."""

    def __init__(self, name: str, groups: tuple[str, ...] = ()) -> None:
        self.name = name
        self.escaped_name = name
        self.groups = [_Group(g) for g in groups]
        self.url = f"/user/{name}/"
        self.base_url = "/"
        self.settings: dict = {}

    def progress_url(self, server_name: str = "") -> str:
        return f"/hub/api/users/{self.name}/server/progress"
