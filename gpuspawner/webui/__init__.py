"""Pages of the project's hub services in JupyterHub's own look: one Jinja2 layout
(``templates/hub_page.html.j2``) that links the hub's stylesheet, Bootstrap and theme script
(served by the hub at ``<hub_prefix>static/``, JupyterHub's ``page.html`` does the same), repeats
the hub's navigation bar and links the service pages to each other. Used by the GPU map
(``/services/gpuspawner/``) and the idle culler's page (``/services/idle-culler/``); it imports
only Jinja2, so either service may use it.

Context every page gives the layout: ``hub_prefix`` (``/hub/``), ``user`` (``name``,
``admin``), ``links``: the service pages as :class:`PageLink` (the current one is marked
``aria-current``), and the blocks ``title``, ``style``, ``main``, ``script``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jinja2 import BaseLoader, ChoiceLoader, Environment, PackageLoader, select_autoescape

#: seconds between two refreshes of a live page (the pages read it from ``data-refresh``)
REFRESH_S = 5


@dataclass(frozen=True)
class PageLink:
    """One entry of the navigation bar: its label, its URL and whether it is this page."""

    label: str
    href: str
    current: bool = False
    #: shown to hub admins only (the page answers 403 to others)
    admin_only: bool = False


def service_links(services_prefix: str, current: str) -> list[PageLink]:
    """The service pages' links: the GPU map and the usage page (admins only) and the idle
    culler page under ``services_prefix`` (``/services/``); ``current`` is the label of the
    page shown."""
    pages = [("GPU map", f"{services_prefix}gpuspawner/admin", True),
             ("Usage", f"{services_prefix}gpuspawner/usage", True),
             ("Idle culler", f"{services_prefix}idle-culler/", False)]
    return [PageLink(label, href, label == current, admin_only)
            for label, href, admin_only in pages]


#: the attributes of a plain dict (``d.items`` in a template is the method, as in Jinja2)
_DICT_ATTRIBUTES = frozenset(dir(dict))


class PageEnvironment(Environment):
    """Jinja2's environment with a faster ``a.b`` on plain dicts (what the pages' views are):
    Jinja2 tries ``getattr`` first and falls back to the item, so each ``a.b`` on a dict
    raised and caught an AttributeError (two fifths of the GPU map's render time at 1,000
    servers). Here a name that is no dict attribute is looked up as the item at once: the
    same result, without the exception."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)


def environment(*loaders: BaseLoader) -> Environment:
    """A Jinja2 environment (:class:`PageEnvironment`) that finds ``hub_page.html.j2`` after
    ``loaders`` (the service's own templates, which extend it); HTML autoescaping on."""
    return PageEnvironment(
        loader=ChoiceLoader([*loaders, PackageLoader("gpuspawner.webui", "templates")]),
        autoescape=select_autoescape(["html", "j2"]))
