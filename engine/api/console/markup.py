"""HTML that is escaped by default: every value put into a template is text unless it is already markup.

The console renders every page on the server. A schedule's target, payload or
an error message written by a consumer may hold ``<script>``; it must reach
the browser as inert text. So values never meet HTML by string concatenation:
:func:`render` formats a template whose fields are escaped (quotes included,
so attribute values are safe too), and only :class:`Markup` — the result of
another :func:`render`, or :func:`join` of markups — passes unescaped.
"""

from __future__ import annotations

import html
import string
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode


class Markup(str):
    """A string that is already safe HTML (produced by :func:`render` or :func:`join`)."""

    __slots__ = ()


def escape(value: Any) -> Markup:
    if isinstance(value, Markup):
        return value
    return Markup(html.escape("" if value is None else str(value), quote=True))


class _Escaping(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, Markup):
            return value
        return escape(format(value, format_spec) if format_spec else value)


_FORMATTER = _Escaping()


def render(template: str, /, **values: Any) -> Markup:
    """``template`` with ``{name}`` fields replaced by escaped ``values`` (markup passes as it is)."""
    return Markup(_FORMATTER.vformat(template, (), values))


def join(parts: Iterable[Any], separator: str = "") -> Markup:
    """Concatenate, escaping every part that is not markup."""
    return Markup(separator.join(escape(part) for part in parts))


def query(path: str, **params: Any) -> str:
    """A same-site URL with its query string encoded (None values left out); escape it when rendered."""
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return path + ("?" + urlencode(kept) if kept else "")
