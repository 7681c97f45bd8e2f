"""Response headers every page and answer of the project's hub services carries (the
``gpuspawner`` service and the idle culler): no other site may frame them
(``Content-Security-Policy: frame-ancestors 'none'`` and, for browsers without CSP level 2,
``X-Frame-Options: DENY``), so a hostile page cannot overlay the GPU map's drain buttons or
the culler's policy form (clickjacking). JupyterHub's own pages send ``frame-ancestors``
likewise; nothing of these services is meant to be shown in a frame.

One place for both services: :func:`add_frame_headers` adds :class:`FrameHeaders` to a Tornado
application, which sets the headers on every response it sends, whatever the handler (pages,
JSON, redirects, errors, the OAuth callback, unknown paths). It imports only Tornado, so the
culler may use it (contract "the idle culler is its own service").
"""

from __future__ import annotations

from tornado import httputil, web

__all__ = ["FRAME_HEADERS", "FrameHeaders", "add_frame_headers"]

#: the CSP directive that forbids framing
FRAME_ANCESTORS = "frame-ancestors 'none'"
#: header -> value set on every response
FRAME_HEADERS = {"Content-Security-Policy": FRAME_ANCESTORS, "X-Frame-Options": "DENY"}


class FrameHeaders(web.OutputTransform):
    """Sets :data:`FRAME_HEADERS` on the response's headers (a handler's own
    ``Content-Security-Policy`` is kept, with ``frame-ancestors 'none'`` added when it has no
    ``frame-ancestors``)."""

    def transform_first_chunk(self, status_code: int, headers: httputil.HTTPHeaders,
                              chunk: bytes, finishing: bool
                              ) -> tuple[int, httputil.HTTPHeaders, bytes]:
        csp = headers.get("Content-Security-Policy", "")
        if not csp:
            headers["Content-Security-Policy"] = FRAME_ANCESTORS
        elif "frame-ancestors" not in csp:
            headers["Content-Security-Policy"] = f"{csp.rstrip('; ')}; {FRAME_ANCESTORS}"
        headers["X-Frame-Options"] = FRAME_HEADERS["X-Frame-Options"]
        return status_code, headers, chunk


def add_frame_headers(app: web.Application) -> web.Application:
    """Add :class:`FrameHeaders` to ``app`` (once); returns ``app``."""
    if FrameHeaders not in app.transforms:
        app.add_transform(FrameHeaders)
    return app
