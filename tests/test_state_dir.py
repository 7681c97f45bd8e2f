"""gpuspawner's state folder (``c.GPUSpawner.state_dir``, gpuspawner.hub.state): every state
file derives from it, not from where the hub's database is, and it is kept private.

The hole replayed (found probing as a hostile user on the same machine): the shipped config's
state folder ``var/hub/`` was created 0755 and the hub's SQLite database 0644, so any local
account could read the database (users, token hashes, OAuth state) and the queue (other users'
``user_options``); and when an admin moved ``JupyterHub.db_url`` the queue and drains files
followed the database, with no setting that said where gpuspawner's state lives.

Unit tests need nothing; the hub tests (``docker``, ``hub``) start the shipped
``hub_config`` through ``tests/hubrunner.py``: one with the database in the state folder, one
with ``db_url`` moved elsewhere.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import requests

from gpuspawner.hub.drains import DrainRecord, DrainState, DrainStore
from gpuspawner.hub.settings import SpawnerSettings, health_settings, queue_settings

QUEUE = "gpuspawner-queue.json"
DRAINS = "gpuspawner-drains.json"


def mode(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- without a hub ------------------------------------------------------------------------------
def test_state_files_derive_from_state_dir_not_from_the_database(tmp_path):
    from gpuspawner.hub.state import resolve_state_dir

    state, db = tmp_path / "state", tmp_path / "db"
    db_url = f"sqlite:///{db}/jupyterhub.sqlite"
    assert "state_dir" in SpawnerSettings.class_traits()
    assert "Empty (default)" in SpawnerSettings.class_traits()["state_dir"].help
    values = {"state_dir": str(state)}
    assert queue_settings(values, db_url).file == str(state / QUEUE)
    assert health_settings(values, db_url).drains_file == str(state / DRAINS)
    # explicit files still win
    assert queue_settings({**values, "queue_file": str(tmp_path / "q.json")}, db_url).file == \
        str(tmp_path / "q.json")
    assert health_settings({**values, "gpu_drains_file": str(tmp_path / "d.json")},
                           db_url).drains_file == str(tmp_path / "d.json")
    # empty state_dir: where the files always were, beside the SQLite database, else the cwd
    assert queue_settings({}, db_url).file == str(db / QUEUE)
    assert resolve_state_dir("", db_url) == str(db)
    assert resolve_state_dir("", "postgresql://db/hub") == os.getcwd()


def test_prepare_state_dir_makes_the_folder_0700_and_files_0600(tmp_path):
    from gpuspawner.hub.state import prepare_state_dir

    state = tmp_path / "state"
    db_url = f"sqlite:///{state}/jupyterhub.sqlite"
    prepare_state_dir(str(state), db_url)
    assert mode(state) == 0o700
    # the database is made empty and 0600 before JupyterHub opens it
    assert mode(state / "jupyterhub.sqlite") == 0o600
    assert (state / "jupyterhub.sqlite").stat().st_size == 0
    # an existing folder named by state_dir, a database and state files, all too open
    os.chmod(state, 0o755)
    os.chmod(state / "jupyterhub.sqlite", 0o644)
    (state / "jupyterhub.sqlite-journal").write_text("")
    os.chmod(state / "jupyterhub.sqlite-journal", 0o644)
    (state / QUEUE).write_text("{}")
    os.chmod(state / QUEUE, 0o644)
    changed = prepare_state_dir(str(state), db_url, [str(state / QUEUE)])
    assert mode(state) == 0o700
    for name in ("jupyterhub.sqlite", "jupyterhub.sqlite-journal", QUEUE):
        assert mode(state / name) == 0o600, name
    assert len(changed) == 4, changed
    # the default folder (the database's, maybe the hub's cwd) keeps its own mode
    other = tmp_path / "srv"
    other.mkdir(mode=0o755)
    os.chmod(other, 0o755)
    prepare_state_dir("", f"sqlite:///{other}/jupyterhub.sqlite")
    assert mode(other) == 0o755
    assert mode(other / "jupyterhub.sqlite") == 0o600


def test_state_files_are_written_0600(tmp_path):
    store = DrainStore(str(tmp_path / DRAINS))
    store.save(DrainState(drains={"GPU-1": DrainRecord("n", "fan", "admin", 1.0)}))
    assert mode(tmp_path / DRAINS) == 0o600


# -- a real hub ---------------------------------------------------------------------------------
UUID = "GPU-5b1e0c2a-0d1f-4c51-9d7b-3a1f2e4d5c6b"


def hub_with_state(tmp: Path, extra_config: str = ""):
    from tests.hubrunner import Hub
    from tests.test_hub_e2e import one_gpu_topology
    from tests.test_service_hub import EXTRA_ADMIN_SCOPES

    nodes = [{"name": "g1", "topology": one_gpu_topology(tmp, "g1", UUID)}]
    # placed (the queue file is written), then refused by the engine: no container is left
    profiles = [{"slug": "gone", "cpu": 0, "memory": "64M", "default": True,
                 "image": "gpuspawner/no-such-image:0"}]
    h = Hub(tmp, nodes, profiles, extra_config=EXTRA_ADMIN_SCOPES + extra_config)
    h.env["GPUSPAWNER_CULLER"] = "off"
    (tmp / "home").mkdir()  # the base of the shipped home_path_template, as a mounted share
    return h


def write_state(hub) -> None:
    """Write both state files: an admin drains the GPU, a spawn is placed (queue written)."""
    r = requests.post(f"{hub.url}/services/gpuspawner/api/gpus/{UUID}/drain", timeout=30,
                      headers={"Authorization": f"token {hub.token}"},
                      data=json.dumps({"reason": "st-state test"}))
    assert r.status_code == 200, r.text
    hub.ensure_user("st-state")
    r = hub.api("POST", "/users/st-state/server", {"profile": "gone"})
    assert r.status_code == 500 and "no-such-image" in r.text, r.text
    hub.wait_stopped("st-state")


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("docker")
    from tests.test_hub_e2e import _engine

    return _engine()


def modes(folder: Path, names: tuple[str, ...]) -> dict[str, str]:
    """``{".": mode of folder, name: mode of folder/name}`` in octal (missing: "absent")."""
    out = {".": oct(mode(folder))}
    for name in names:
        out[name] = oct(mode(folder / name)) if (folder / name).exists() else "absent"
    return out


@pytest.mark.docker
@pytest.mark.hub
def test_state_folder_0700_and_files_0600_after_hub_start_and_writes(engine, tmp_path):
    hub = hub_with_state(tmp_path)
    state = Path(hub.env["GPUSPAWNER_STATE_DIR"])
    # a folder left 0755 by an earlier hub (gpuspawner before state_dir) is tightened
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    hub.start()
    try:
        started = ("jupyterhub.sqlite", "jupyterhub_cookie_secret")
        assert modes(state, started) == {".": "0o700", **dict.fromkeys(started, "0o600")}
        write_state(hub)
        written = (QUEUE, DRAINS, "jupyterhub.sqlite")
        assert modes(state, written) == {".": "0o700", **dict.fromkeys(written, "0o600")}
        # and after a restart (the database and the files exist already)
        hub.stop()
        hub.start()
        assert modes(state, written) == {".": "0o700", **dict.fromkeys(written, "0o600")}
    finally:
        hub.stop()


@pytest.mark.docker
@pytest.mark.hub
def test_state_stays_in_state_dir_when_db_url_moves(engine, tmp_path):
    db = tmp_path / "db"
    db.mkdir()
    # the admin moves db_url; the shipped config's own check (before this line) built the
    # cluster for the old place: forget it, as if db_url had been set before that check
    hub = hub_with_state(tmp_path, f"c.JupyterHub.db_url = 'sqlite:///{db}/jupyterhub.sqlite'\n"
                         "from gpuspawner.hub.cluster import reset_clusters\n"
                         "reset_clusters()\n")
    state = Path(hub.env["GPUSPAWNER_STATE_DIR"])
    hub.start()
    try:
        write_state(hub)
        assert (db / "jupyterhub.sqlite").exists()
        assert {"db": sorted(p.name for p in db.iterdir() if p.name.startswith("gpuspawner")),
                "state": modes(state, (QUEUE, DRAINS))} == {
            "db": [], "state": {".": "0o700", QUEUE: "0o600", DRAINS: "0o600"}}
        assert json.loads((state / DRAINS).read_text())["drains"][UUID]["reason"] == \
            "st-state test"
    finally:
        hub.stop()
