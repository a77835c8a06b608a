"""The operator console at ``/ui``: server-rendered pages, one small script, no build step.

* :mod:`.app` — routes, sign-in, actions (CSRF-checked), live fragments;
* :mod:`.pages` — the pages as pure functions of their data;
* :mod:`.markup` — HTML escaped by default; :mod:`.charts` — inline SVG;
* :mod:`.sessions` — sign-in with a tenant's API token or an operator token;
* :mod:`.preview` — next fires with daylight-saving days marked;
* ``static/`` — ``console.js`` and ``console.css``.
"""
