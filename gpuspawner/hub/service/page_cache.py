"""The admin GPU map's rendered pages, kept per viewer while nothing the page shows changed.

Why: the map (``GET admin``, :class:`~gpuspawner.hub.service.app.AdminPageHandler`) is about
1 MiB of HTML at 1,000 servers; made anew at every GET (a browser tab refreshes it every
:data:`~gpuspawner.webui.REFRESH_S` seconds) its view and render took hundreds of
milliseconds and left enough garbage to set off most of the hub's full garbage collections.
Most GETs find nothing changed since the last one.

What is kept: per viewer (:func:`page_key`: kind, name, rights, query string, as a tuple), the
page as encoded parts around its xsrf token, with the :class:`MapStamp` of what it shows. A
GET serves the kept page when its stamp is the same as the cluster's now (identity of every
object the page reads, :meth:`MapStamp.same`) and it is at most :data:`MAX_AGE_S` old; the
request's own xsrf token goes into it at each request (:meth:`KeptPage.page`), so no viewer
is ever sent another request's token. At most :data:`MAX_PAGES` pages are kept, the least
recently used dropped first. A refused request (401/403) never reaches the cache.

Why identity is enough: everything the page reads is replaced, never changed in place, when
it changes. The ledger's snapshot is incremental (:meth:`~gpuspawner.placement.Ledger.snapshot`:
a node's dict is kept until something on that node changes, a booking, release, restore,
adoption, state change, drain or undrain, and is then made anew), and the allocations table,
quota use and owner colours are made from the allocations, each of which dirties its node's
dict when booked or released. Drain records (:class:`~gpuspawner.hub.drains.DrainRecord`),
health readings (:class:`~gpuspawner.inventory.health.GPUHealth`) and moves are new objects
each time; a node's GPU share mechanism is chosen at hub start. The quota table and the
placement policy's name are compared as well. :data:`MAX_AGE_S` bounds what an in-place change
nobody makes today would leave on a page.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from markupsafe import escape

__all__ = ["MAX_AGE_S", "MAX_PAGES", "KeptPage", "MapStamp", "PageCache", "PageKey",
           "page_key", "xsrf_placeholder"]

#: the most pages kept (one per viewer and query string; the least recently used dropped)
MAX_PAGES = 8
#: the oldest kept page served, seconds since its cluster was copied
MAX_AGE_S = 15.0

#: (viewer's kind, name, rights, query string): see :func:`page_key`
PageKey = tuple[str, str, Hashable, str]

_MISSING = object()


def page_key(kind: str, name: str, rights: Hashable, query: str) -> PageKey:
    """The key of a viewer's page: a tuple, never a joined string, so a user and a service
    of the same name, or names holding separator characters, never share a page.

    Args:
        kind: ``"user"`` or ``"service"`` (the hub model's ``kind``).
        name: the viewer's name.
        rights: what of the viewer's rights decides the page (hashable, e.g. a frozenset of
            scopes and flags).
        query: the request's query string, as sent.
    """
    return (kind, name, rights, query)


def xsrf_placeholder() -> str:
    """A new random placeholder for the xsrf token while a page is rendered (32 hex digits
    after ``xsrf-``: no other text of the page can hold it; autoescaping leaves it as is)."""
    return f"xsrf-{secrets.token_hex(16)}"


def _same_values(kept: Mapping[Any, Any], now: Mapping[Any, Any]) -> bool:
    """Same keys (equal) holding the same objects (identical)."""
    if len(kept) != len(now):
        return False
    get = now.get
    return all(get(k, _MISSING) is v for k, v in kept.items())


class MapStamp:
    """The identities of what the admin map shows, read from the cluster on the event loop.

    Args:
        cluster: the hub's cluster (or anything with its read side: ``ledger``, ``nodes``,
            ``drain_records()``, ``last_health``, ``moves``).
        at: when it was read (the cache's clock), seconds.

    Holds the ledger snapshot's node dicts, the drain records, the health readings per GPU,
    each node's GPU share mechanism, the newest move (and how many are kept), the quota table
    and its default quota, and the placement policy's name. Reading it costs the ledger's
    snapshot (incremental) and a copy of three small dicts: O(nodes + GPUs).
    """

    __slots__ = ("at", "drains", "health", "moves", "nodes", "policy", "quotas", "shares")

    def __init__(self, cluster: Any, at: float) -> None:
        ledger = cluster.ledger
        self.at = at
        self.nodes = ledger.snapshot()
        drains = getattr(cluster, "drain_records", None)
        self.drains: dict[str, Any] = drains() if drains is not None else {}
        self.health = dict(getattr(cluster, "last_health", None) or {})
        self.shares = {name: getattr(rt, "gpu_share", None)
                       for name, rt in cluster.nodes.items()}
        moves = getattr(cluster, "moves", ())
        self.moves = (len(moves), moves[-1] if moves else None)
        quotas = ledger.quotas
        self.quotas = (quotas, getattr(quotas, "default_user", None))
        self.policy = ledger.policy_name

    def same(self, other: MapStamp) -> bool:
        """Whether ``other`` shows the same objects (compared with ``is``; counts, names and
        the policy's name with ``==``): then a page made with one is the page of the other."""
        a, b = self.nodes, other.nodes
        if len(a) != len(b) or any(x is not y for x, y in zip(a, b, strict=True)):
            return False
        return (self.moves[0] == other.moves[0] and self.moves[1] is other.moves[1]
                and self.quotas[0] is other.quotas[0] and self.quotas[1] is other.quotas[1]
                and self.policy == other.policy
                and _same_values(self.drains, other.drains)
                and _same_values(self.health, other.health)
                and _same_values(self.shares, other.shares))


class KeptPage:
    """One rendered page: its UTF-8 text cut at the xsrf token's places, and its stamp.

    Args:
        parts: the page's bytes between the token's places (``n + 1`` parts for ``n``
            places).
        stamp: what it shows.
    """

    __slots__ = ("parts", "size", "stamp")

    def __init__(self, parts: list[bytes], stamp: MapStamp) -> None:
        self.parts = parts
        self.stamp = stamp
        self.size = sum(map(len, parts))

    @classmethod
    def from_html(cls, html: str, placeholder: str, stamp: MapStamp) -> KeptPage:
        """From a page rendered with ``placeholder`` where the xsrf token goes."""
        return cls([p.encode("utf-8") for p in html.split(placeholder)], stamp)

    def page(self, xsrf: str) -> bytes:
        """The page with the request's own xsrf token, HTML-escaped as the template
        escapes it (UTF-8)."""
        return str(escape(xsrf)).encode("utf-8").join(self.parts)


class PageCache:
    """The kept pages: at most ``max_pages``, each served while at most ``max_age_s`` old and
    while the cluster's stamp is the same.

    Args:
        max_pages: the most pages kept (least recently used dropped first).
        max_age_s: the oldest page served, seconds.
        clock: seconds, monotonic (``time.monotonic``; the tests pass their own).

    Attributes:
        renders: pages kept (each one rendered), hits: kept pages served.

    Used on the event loop only (no lock): :meth:`stamp` and :meth:`get` before the render,
    :meth:`put` after it.
    """

    def __init__(self, max_pages: int = MAX_PAGES, max_age_s: float = MAX_AGE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_pages < 1:
            raise ValueError(f"max_pages must be at least 1, got {max_pages}")
        self.max_pages = max_pages
        self.max_age_s = max_age_s
        self.clock = clock
        self._pages: OrderedDict[PageKey, KeptPage] = OrderedDict()
        self.renders = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._pages)

    def __contains__(self, key: object) -> bool:
        return key in self._pages

    def stamp(self, cluster: Any) -> MapStamp:
        """The cluster's :class:`MapStamp` now (read it in the same stretch of the event loop
        as the copy a render is made from)."""
        return MapStamp(cluster, self.clock())

    def get(self, key: PageKey, stamp: MapStamp) -> KeptPage | None:
        """The page kept for ``key`` when it shows what ``stamp`` shows and is at most
        ``max_age_s`` old (then it becomes the most recently used); else None (and a stale
        page is dropped)."""
        kept = self._pages.get(key)
        if kept is None:
            return None
        if stamp.at - kept.stamp.at > self.max_age_s or not kept.stamp.same(stamp):
            del self._pages[key]
            return None
        self._pages.move_to_end(key)
        self.hits += 1
        return kept

    def put(self, key: PageKey, page: KeptPage) -> KeptPage:
        """Keep ``page`` for ``key`` (replacing what was kept), dropping the least recently
        used beyond ``max_pages``; returns ``page``."""
        self.renders += 1
        self._pages[key] = page
        self._pages.move_to_end(key)
        while len(self._pages) > self.max_pages:
            self._pages.popitem(last=False)
        return page

    def clear(self) -> None:
        """Drop every kept page."""
        self._pages.clear()
