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
"""

from __future__ import annotations

import json
import logging
import weakref
from typing import Any

from tornado import web

from .profiles import OptionsError, choose_profile, load_profiles

_installed: dict[str, Any] = {}
#: refusals recorded during a spawn, by ``orm.Spawner`` row; raised by :func:`pending_refusal`
_refused: weakref.WeakKeyDictionary[Any, web.HTTPError] = weakref.WeakKeyDictionary()


def pending_refusal(orm_spawner: Any) -> web.HTTPError | None:
    """The refusal the guard recorded for ``orm_spawner``'s last ``user_options``, cleared."""
    if orm_spawner is None:
        return None
    return _refused.pop(orm_spawner, None)


def check_user_options(options: Any, profiles_config: Any, groups: list[str],
                       max_bytes: int) -> None:
    """Check ``options`` against the size limit and the profiles.

    Args:
        options: the decoded ``user_options`` (dict or None).
        profiles_config: ``GPUSpawner.profiles`` (list of dicts or a YAML path).
        groups: the user's JupyterHub group names.
        max_bytes: largest JSON encoding accepted, bytes.

    Raises:
        web.HTTPError(400): too large (message ``user_options: ...``) or a field the profiles
            refuse (message ``<field>: <reason>``).
    """
    if options is None:
        return
    size = len(json.dumps(options, default=str).encode())
    if size > max_bytes:
        raise web.HTTPError(400, f"user_options: {size} bytes is more than the "
                                 f"{max_bytes} allowed")
    try:
        choose_profile(options, load_profiles(profiles_config), groups)
    except OptionsError as e:
        raise web.HTTPError(400, str(e)) from None


def install_user_options_guard(profiles_config: Any, max_bytes: int,
                               log: logging.Logger | None = None) -> bool:
    """Register the ``set`` listener on ``orm.Spawner.user_options`` once per process, checking
    with the first spawner's ``profiles`` and ``user_options_max_bytes`` (``start`` checks
    again with the spawner's own). Returns True when it registered now. A profile
    configuration that does not load is left to ``start`` (HTTP 500 there, with the field)."""
    if _installed:
        return False
    from jupyterhub import orm
    from sqlalchemy import event

    def on_set(target: Any, value: Any, oldvalue: Any, initiator: Any) -> Any:
        user = getattr(target, "user", None)
        groups = sorted(g.name for g in (getattr(user, "groups", None) or []))
        _refused.pop(target, None)
        try:
            check_user_options(value, profiles_config, groups, max_bytes)
        except web.HTTPError as e:
            if getattr(target, "server", None) is None:
                raise  # PUT/PATCH: nothing else was made, answer 400 now
            _refused[target] = e
            return oldvalue if isinstance(oldvalue, dict) else {}
        except Exception as e:  # a broken profile file: start() reports it with the field
            if log:
                log.debug("user_options guard skipped: %s", e)
        return value

    event.listen(orm.Spawner.user_options, "set", on_set, retval=True)
    _installed["listener"] = on_set
    return True
