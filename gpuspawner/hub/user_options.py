"""Refuse bad ``user_options`` before JupyterHub stores them.

JupyterHub saves the ``user_options`` of a spawn request in its database (``orm.Spawner``)
*before* it calls ``Spawner.apply_user_options`` or ``start`` (``jupyterhub/user.py``,
``User.spawn``; the REST ``PUT``/``PATCH`` of a named server store them without any spawner
call). A rejected request would therefore still be stored and echoed back by the REST API, and
a megabyte of options would sit in every later server model. The hub offers no hook before
that point, so this module listens to SQLAlchemy's attribute ``set`` event of
``orm.Spawner.user_options`` (SQLAlchemy docs, "ORM Events: AttributeEvents.set"). A value
that is too large or that the spawner's profiles refuse is never assigned:

- outside a spawn (REST ``PUT``/``PATCH`` of a named server) the listener raises
  ``HTTPError(400)`` at once;
- inside a spawn (the hub has already made the server's database row) the listener keeps the
  previous value and records the refusal; ``GPUSpawner.apply_user_options``, which JupyterHub
  runs inside its spawn ``try`` block, raises it as ``HTTPError(400)``, so the hub cleans up
  the half-made server as after any failed spawn.

A refused spawn leaves the hub's database as it was (:func:`watch_spawn`, from
``GPUSpawner.apply_group_overrides``, JupyterHub's first spawner call in ``User.spawn``): the
REST ``POST`` of a *new* named server makes its record (``orm.Spawner``) before the spawn, and
a failed spawn keeps it, so five refused spawns on new names used to fill
``named_server_limit_per_user`` with records the user model does not list. When the spawn
ends in a refusal (an HTTP 4xx: options, quota, capacity), a record this very request made
(:data:`_born`, set by SQLAlchemy's ``init`` event of ``orm.Spawner``, after the request's
start) is deleted, as ``DELETE ... {"remove": true}`` would; an existing record gets back the
``user_options`` it had before the spawn (the guard keeps refused options out; a spawn refused
for quota or capacity would otherwise keep the new ones as the next start's defaults).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import weakref
from typing import Any

from tornado import web

from .images import check_allowed_registries, check_deny_patterns
from .profiles import OptionsError, load_profiles
from .request import checked_request

_installed: dict[str, Any] = {}
#: refusals recorded during a spawn, by ``orm.Spawner`` row; raised by :func:`pending_refusal`
_refused: weakref.WeakKeyDictionary[Any, web.HTTPError] = weakref.WeakKeyDictionary()
#: when each ``orm.Spawner`` this process made was made (``time.time()``)
_born: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
#: the asyncio task that made each ``orm.Spawner`` (a ``PUT`` makes and sets it in one task)
_born_task: weakref.WeakKeyDictionary[Any, asyncio.Task] = weakref.WeakKeyDictionary()
#: ``user_options`` of an ``orm.Spawner`` before the spawn that set new ones, with that spawn's
#: ``orm.Server`` (to tell this spawn's value from an earlier one's)
_before_spawn: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()
#: set while :func:`watch_spawn` puts the previous ``user_options`` back (not checked again)
_restoring: list[bool] = []
_log = logging.getLogger("gpuspawner")


def pending_refusal(orm_spawner: Any) -> web.HTTPError | None:
    """The refusal the guard recorded for ``orm_spawner``'s last ``user_options``, cleared."""
    if orm_spawner is None:
        return None
    return _refused.pop(orm_spawner, None)


def check_user_options(options: Any, profiles_config: Any, groups: list[str],
                       max_bytes: int, deny_images: Any = (),
                       allowed_registries: Any = ()) -> None:
    """Check ``options`` as the spawner will (:func:`gpuspawner.hub.request.checked_request`:
    size, the ``user-options`` schema, the profiles; the result is kept for the spawn).

    Args:
        options: the decoded ``user_options`` (dict or None).
        profiles_config: ``GPUSpawner.profiles`` (list of dicts or a YAML path).
        groups: the user's JupyterHub group names.
        max_bytes: largest JSON encoding accepted, bytes.
        deny_images: ``GPUSpawner.image_deny_patterns`` (strings or compiled patterns).
        allowed_registries: ``GPUSpawner.allowed_registries`` (``host`` or ``host:port``).

    Raises:
        web.HTTPError(400): too large (message ``user_options: ...``) or a field the schema
            or the profiles refuse (message ``<field>: <reason>``).
    """
    if options is None:
        return
    try:
        checked_request(options, load_profiles(profiles_config), groups, max_bytes,
                        check_deny_patterns(list(deny_images)),
                        check_allowed_registries(list(allowed_registries)))
    except OptionsError as e:
        raise web.HTTPError(400, str(e)) from None


def install_user_options_guard(profiles_config: Any, max_bytes: int,
                               log: logging.Logger | None = None,
                               deny_images: Any = (), allowed_registries: Any = ()) -> bool:
    """Register the ``set`` listener on ``orm.Spawner.user_options`` once per process, checking
    with the first spawner's ``profiles``, ``user_options_max_bytes`` and
    ``image_deny_patterns`` and ``allowed_registries`` (``start`` checks
    again with the spawner's own). Returns True when it registered now. A profile
    configuration that does not load is left to ``start`` (HTTP 500 there, with the field)."""
    if _installed:
        return False
    from jupyterhub import orm
    from sqlalchemy import event

    def on_set(target: Any, value: Any, oldvalue: Any, initiator: Any) -> Any:
        if _restoring:
            return value
        if getattr(target, "server", None) is not None:  # inside a spawn: keep the old value
            _before_spawn[target] = (target.server, copy.deepcopy(
                oldvalue if isinstance(oldvalue, dict) else {}))
        user = getattr(target, "user", None)
        groups = sorted(g.name for g in (getattr(user, "groups", None) or []))
        _refused.pop(target, None)
        try:
            check_user_options(value, profiles_config, groups, max_bytes, deny_images,
                               allowed_registries)
        except web.HTTPError as e:
            if getattr(target, "server", None) is None:
                # PUT of a new named server: JupyterHub made (and committed) its record just
                # before it set the options; a refusal must not leave that record behind
                if _born_in_this_task(target):
                    _remove_new_record(target)
                raise  # PUT/PATCH: answer 400 now
            _refused[target] = e
            return oldvalue if isinstance(oldvalue, dict) else {}
        except Exception as e:  # a broken profile file: start() reports it with the field
            if log:
                log.debug("user_options guard skipped: %s", e)
        return value

    # active_history: the old value even when not loaded (kept for a refused spawn)
    event.listen(orm.Spawner.user_options, "set", on_set, retval=True, active_history=True)
    _installed["listener"] = on_set
    mark_new_records()
    return True


def _on_spawner_init(target: Any, args: Any, kwargs: Any) -> None:
    _born[target] = time.time()
    task = _current_task()
    if task is not None:
        _born_task[target] = task


def _current_task() -> asyncio.Task | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running event loop
        return None


def _born_in_this_task(orm_spawner: Any) -> bool:
    """Whether ``orm_spawner`` was made by the request being answered now: JupyterHub's
    ``PUT /users/{name}/servers/{server}`` makes the record and sets its ``user_options`` in
    one handler coroutine, with no ``await`` between, so the record's maker is this task."""
    task = _current_task()
    return task is not None and _born_task.get(orm_spawner) is task


def _remove_new_record(orm_spawner: Any) -> None:
    """Delete the named server record a refused ``PUT`` made (its spawner object too, from the
    hub's user; as ``DELETE ... {"remove": true}`` would). Failures are logged, never raised:
    the caller answers the refusal."""
    from sqlalchemy import inspect as sa_inspect

    try:
        session = sa_inspect(orm_spawner).session
        orm_user = orm_spawner.user
        name = orm_spawner.name
        try:
            from jupyterhub.app import JupyterHub

            if JupyterHub.initialized() and orm_user is not None:
                user = JupyterHub.instance().users.get(orm_user.id)
                spawners = getattr(user, "spawners", None)
                if spawners is not None and name in spawners \
                        and spawners[name].orm_spawner is orm_spawner:
                    spawners.pop(name)
        except Exception:  # the record goes anyway
            _log.debug("refused PUT: no hub user for %s", name, exc_info=True)
        if session is not None:
            _log.info("named server %r of %s: options refused; removing the record its PUT "
                      "made", name, getattr(orm_user, "name", "?"))
            try:
                session.delete(orm_spawner)
                session.commit()
            except Exception:
                session.rollback()  # the hub's one session must stay usable
                raise
    except Exception:
        _log.exception("could not remove the named server record of a refused PUT")


def mark_new_records() -> None:
    """Note when each ``orm.Spawner`` is made (SQLAlchemy ``init`` event), once per process.
    Registered when this module is imported (with the spawner class, while the hub loads its
    configuration), before any request can make a record."""
    try:
        from jupyterhub import orm
        from sqlalchemy import event
    except ImportError:  # pragma: no cover - the hub side without JupyterHub
        return
    if not event.contains(orm.Spawner, "init", _on_spawner_init):
        event.listen(orm.Spawner, "init", _on_spawner_init)


def _made_by_this_request(orm_spawner: Any, handler: Any) -> bool:
    """Whether ``orm_spawner`` was made while ``handler``'s request was being answered."""
    born = _born.get(orm_spawner)
    request = getattr(handler, "request", None)
    if born is None or request is None:
        return False
    return born >= time.time() - request.request_time()


def watch_spawn(spawner: Any) -> None:
    """Called at the start of every spawn of ``spawner`` (inside JupyterHub's ``User.spawn``):
    when the spawn ends in a refusal (HTTP 4xx), delete the named server's record if this
    request made it, else put back the ``user_options`` it had before this spawn (see the
    module's docstring). Anything else (success, 5xx, cancel) changes nothing."""
    orm_spawner = getattr(spawner, "orm_spawner", None)
    future = getattr(spawner, "_spawn_future", None)
    if orm_spawner is None or future is None or future.done():
        return
    before = _before_spawn.pop(orm_spawner, None)
    previous = before[1] if before and before[0] is orm_spawner.server else None
    new = bool(spawner.name) and _made_by_this_request(orm_spawner, spawner.handler)
    if not new and previous is None:
        return

    def done(f: Any) -> None:
        if f.cancelled():
            return
        e = f.exception()
        if not (isinstance(e, web.HTTPError) and 400 <= e.status_code < 500):
            return
        if spawner.active or orm_spawner.server is not None:
            return
        try:
            if new:
                _remove_record(spawner, orm_spawner, e.status_code)
            elif orm_spawner.user_options != previous:
                _restoring.append(True)
                try:
                    orm_spawner.user_options = previous
                    spawner.user.db.commit()
                except Exception:
                    spawner.user.db.rollback()
                    raise
                finally:
                    _restoring.pop()
                spawner.user_options = previous
        except Exception:  # never let the cleanup hide the refusal
            _log.exception("%s: could not undo the refused spawn", spawner._log_name)

    future.add_done_callback(done)


def _remove_record(spawner: Any, orm_spawner: Any, status: int) -> None:
    """Delete the named server record ``orm_spawner`` that the refused request made."""
    user = spawner.user
    if user.orm_spawners.get(spawner.name) is not orm_spawner:
        return  # renamed or replaced meanwhile
    _log.info("%s: spawn refused (HTTP %s); removing the named server its request made",
              spawner._log_name, status)
    if user.spawners.get(spawner.name) is spawner:
        user.spawners.pop(spawner.name)
    db = user.db
    try:  # as JupyterHub's DELETE .../servers/NAME {"remove": true} does
        db.delete(orm_spawner)
        db.commit()
    except Exception:
        db.rollback()  # the hub's one session must stay usable
        raise


mark_new_records()
