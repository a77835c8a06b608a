"""The console's pages: data in, escaped HTML out (pure; no I/O).

Every value reaches HTML through :func:`engine.api.console.markup.render`, so
text from a tenant (targets, payloads, errors) renders inert. Sections that
refresh live carry ``data-live="NAME"``: the console's script re-fetches the
page with ``?fragment=NAME`` every few seconds and swaps that section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from engine.api.console.charts import line_chart
from engine.api.console.markup import Markup, join, query, render
from engine.api.console.sessions import Principal
from engine.control.quotas import TenantQuotas, TenantUsage

NAV = (("/ui/schedules", "Schedules"), ("/ui/dead-letters", "Dead letters"), ("/ui/health", "Health"))
STATES = ("active", "paused", "canceled", "completed")
VERDICT_CLASS = {
    "SUCCEEDED": "ok",
    "DEAD": "bad",
    "ABSENT": "bad",
    "MISSED": "warn",
    "SKIPPED_OVERLAP": "warn",
    "CANCELED": "muted",
    "PAUSED": "muted",
    "UPCOMING": "muted",
    "HELD": "info",
    "PENDING": "warn",
    "SCHEDULED": "info",
    "ENQUEUED": "info",
    "RUNNING": "info",
    "RETRY_WAIT": "warn",
}


def layout(title: str, body: Markup, principal: Principal | None, csrf: str | None, active: str = "") -> Markup:
    nav = Markup("")
    if principal is not None:
        links = join(
            render(
                '<a href="{href}" class="{cls}">{label}</a>',
                href=href,
                label=label,
                cls="active" if href == active else "",
            )
            for href, label in NAV
        )
        who = (
            "operator " + principal.operator + " (every tenant)"
            if principal.operator
            else "tenant " + (principal.tenant_id or "")
        )
        nav = render(
            '<nav><span class="brand">chronoq</span>{links}<span class="who">{who}</span>'
            '<form method="post" action="/ui/logout" class="inline">'
            '<input type="hidden" name="csrf_token" value="{csrf}">'
            '<button type="submit" class="link">Sign out</button></form></nav>',
            links=links,
            who=who,
            csrf=csrf or "",
        )
    return render(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="csrf-token" content="{csrf}"><title>{title} · chronoq</title>'
        '<link rel="stylesheet" href="/ui/static/console.css"><script src="/ui/static/console.js" defer></script>'
        "</head><body>{nav}<main><h1>{title}</h1>{body}</main></body></html>",
        csrf=csrf or "",
        title=title,
        nav=nav,
        body=body,
    )


def login_page(error: str | None = None) -> Markup:
    message = render('<p class="error">{e}</p>', e=error) if error else Markup("")
    return layout(
        "Sign in",
        render(
            '{message}<form method="post" action="/ui/login" class="card narrow">'
            "<label>API token (a tenant's <code>cq_…</code> or an operator's <code>cqop_…</code>)"
            '<input type="password" name="token" id="token" autocomplete="off" required></label>'
            '<button type="submit" id="sign-in">Sign in</button></form>'
            '<p class="hint">A tenant\'s token comes from <code>chronoq tenant create</code>; an operator token from'
            " <code>chronoq operator token NAME</code>. The token is checked once; the browser then holds only a"
            " session cookie.</p>",
            message=message,
        ),
        None,
        None,
    )


def error_page(status: int, message: str, principal: Principal | None, csrf: str | None) -> Markup:
    return layout(
        f"Error {status}",
        render('<p class="error">{m}</p><p><a href="/ui/schedules">Back to the schedules</a></p>', m=message),
        principal,
        csrf,
    )


def _state(state: str) -> Markup:
    return render('<span class="state state-{s}">{s}</span>', s=state)


def _verdict(verdict: str) -> Markup:
    return render('<span class="verdict v-{cls}">{v}</span>', cls=VERDICT_CLASS.get(verdict, "muted"), v=verdict)


def _when(schedule: Mapping[str, Any]) -> str:
    zone = schedule.get("time_zone") or "UTC"
    return f"{schedule['kind']} {schedule['expression']}" + (f" ({zone})" if schedule["kind"] == "cron" else "")


def schedule_rows(items: Sequence[Mapping[str, Any]], principal: Principal) -> Markup:
    if not items:
        return Markup('<tr><td colspan="7" class="empty">No schedules match.</td></tr>')
    rows = []
    for s in items:
        rows.append(
            render(
                '<tr data-schedule-id="{id}"><td><a href="/ui/schedules/{id}">{short}</a></td>{tenant}<td>{target}</td>'
                "<td>{when}</td><td>{state}</td><td>v{version}</td><td>{next}</td></tr>",
                id=s["schedule_id"],
                short=s["schedule_id"][:8],
                target=s["target"],
                when=_when(s),
                state=_state(s["state"]),
                version=s["version"],
                next=s["next_run_at"] or "—",
                tenant=render("<td>{t}</td>", t=s["tenant_id"]) if principal.operator else Markup(""),
            )
        )
    return join(rows)


def schedules_page(
    items: Sequence[Mapping[str, Any]],
    next_cursor: str | None,
    filters: Mapping[str, Any],
    counts: Mapping[str, int],
    principal: Principal,
    csrf: str,
    notice: str | None = None,
) -> Markup:
    options = join(
        render(
            '<option value="{v}" {sel}>{label}</option>',
            v=v,
            label=f"{v} ({counts.get(v, 0)})",
            sel=Markup("selected") if filters.get("state") == v else Markup(""),
        )
        for v in STATES
    )
    tenant_filter = (
        render('<label>Tenant <input name="tenant" value="{t}" size="10"></label>', t=filters.get("tenant") or "")
        if principal.operator
        else Markup("")
    )
    more = (
        render(
            '<p><a href="{href}" id="next-page">Next page →</a></p>',
            href=query("/ui/schedules", **{**filters, "cursor": next_cursor}),
        )
        if next_cursor
        else Markup("")
    )
    head_tenant = Markup("<th>Tenant</th>") if principal.operator else Markup("")
    body = render(
        '{notice}<div class="toolbar"><form method="get" action="/ui/schedules" class="filters">'
        '<label>State <select name="state"><option value="">any</option>{options}</select></label>'
        '<label>Target <input name="target" value="{target}" size="14"></label>{tenant_filter}'
        '<label>Search <input name="q" value="{q}" size="18" placeholder="target, expression, id"></label>'
        '<button type="submit">Filter</button></form>'
        '<a class="button" href="/ui/schedules/new" id="new-schedule">New schedule</a></div>'
        '<table class="list"><thead><tr><th>Schedule</th>{head_tenant}<th>Target</th><th>When</th><th>State</th>'
        "<th>Version</th><th>Next run (UTC)</th></tr></thead>"
        '<tbody data-live="rows" id="schedule-rows">{rows}</tbody></table>{more}',
        notice=_notice(notice),
        options=options,
        target=filters.get("target") or "",
        q=filters.get("q") or "",
        tenant_filter=tenant_filter,
        head_tenant=head_tenant,
        rows=schedule_rows(items, principal),
        more=more,
    )
    return layout("Schedules", body, principal, csrf, "/ui/schedules")


def _notice(notice: str | None) -> Markup:
    return render('<p class="notice" id="notice">{n}</p>', n=notice) if notice else Markup("")


def new_schedule_page(
    principal: Principal, csrf: str, values: Mapping[str, Any] | None = None, error: str | None = None
) -> Markup:
    values = values or {}

    def field(name: str, label: str, placeholder: str = "", size: int = 24) -> Markup:
        return render(
            '<label>{label}<input name="{name}" id="f-{name}" value="{value}" placeholder="{ph}"'
            ' size="{size}"></label>',
            label=label,
            name=name,
            value=values.get(name) or "",
            ph=placeholder,
            size=size,
        )

    kinds = join(
        render(
            '<option value="{k}" {sel}>{k}</option>',
            k=k,
            sel=Markup("selected") if values.get("kind", "cron") == k else Markup(""),
        )
        for k in ("cron", "rate", "once")
    )
    tenant = field("tenant", "Tenant", "acme", 12) if principal.operator else Markup("")
    body = render(
        '{error}<div class="split"><form method="post" action="/ui/schedules" class="card" id="create-form"'
        ' data-preview="/ui/preview">'
        '<input type="hidden" name="csrf_token" value="{csrf}">{tenant}'
        '<label>Kind <select name="kind" id="f-kind">{kinds}</select></label>'
        "{expression}{zone}{target}"
        '<label>Payload (JSON)<textarea name="payload" id="f-payload" rows="3">{payload}</textarea></label>'
        "{misfire}{overlap}{key}"
        '<button type="submit" id="create">Create schedule</button></form>'
        '<section class="card" id="preview"><h2>Next fires</h2>'
        '<p class="hint">Updates as you type. Days on which the zone\'s clocks change are marked.</p>'
        '<ol id="preview-list"></ol><p class="error" id="preview-error"></p></section></div>',
        error=render('<p class="error" id="form-error">{e}</p>', e=error) if error else Markup(""),
        csrf=csrf,
        tenant=tenant,
        kinds=kinds,
        expression=field("expression", "Expression", "0 9 * * MON-FRI · 15m · 2027-03-01T09:00:00Z"),
        zone=field("time_zone", "Time zone (IANA)", "Europe/Berlin"),
        target=field("target", "Target", "billing.invoice"),
        payload=values.get("payload") or "{}",
        misfire=field("misfire_policy", "Misfire policy", "fire_once", 12),
        overlap=field("overlap_policy", "Overlap policy", "allow", 12),
        key=field("idempotency_key", "Idempotency key (optional)", "", 18),
    )
    return layout("New schedule", body, principal, csrf, "/ui/schedules")


def _definition(schedule: Mapping[str, Any]) -> Markup:
    shown = (
        "tenant_id",
        "target",
        "kind",
        "expression",
        "time_zone",
        "priority",
        "misfire_policy",
        "max_lateness",
        "overlap_policy",
        "max_attempts",
        "deadline",
        "created_at",
        "updated_at",
    )
    rows = join(
        render("<tr><th>{k}</th><td>{v}</td></tr>", k=k, v=schedule.get(k) if schedule.get(k) is not None else "—")
        for k in shown
    )
    payload = orjson.dumps(schedule.get("payload"), option=orjson.OPT_INDENT_2).decode()
    return render(
        '<table class="kv">{rows}<tr><th>payload</th><td><pre id="payload">{p}</pre></td></tr></table>',
        rows=rows,
        p=payload,
    )


def _actions(schedule: Mapping[str, Any], csrf: str) -> Markup:
    sid = schedule["schedule_id"]
    buttons = []
    state = schedule["state"]
    for action, label, allowed in (
        ("pause", "Pause", state == "active"),
        ("resume", "Resume", state == "paused"),
        ("trigger", "Trigger now", state != "canceled"),
        ("cancel", "Cancel", state in ("active", "paused")),
    ):
        if allowed:
            buttons.append(
                render(
                    '<form method="post" action="/ui/schedules/{sid}/{action}" class="inline"{confirm}>'
                    '<input type="hidden" name="csrf_token" value="{csrf}">'
                    '<button type="submit" id="action-{action}" class="{cls}">{label}</button></form>',
                    sid=sid,
                    action=action,
                    csrf=csrf,
                    label=label,
                    cls="danger" if action == "cancel" else "",
                    confirm=Markup(' data-confirm="Cancel this schedule for good?"')
                    if action == "cancel"
                    else Markup(""),
                )
            )
    return join(buttons)


def _backfill_form(schedule: Mapping[str, Any], csrf: str, window: Mapping[str, str]) -> Markup:
    if schedule["state"] not in ("active", "completed"):
        return Markup("")
    return render(
        '<form method="post" action="/ui/schedules/{sid}/backfill" class="inline backfill">'
        '<input type="hidden" name="csrf_token" value="{csrf}">'
        '<label>Backfill from <input name="from" id="backfill-from" value="{f}" size="22"></label>'
        '<label>to <input name="to" id="backfill-to" value="{t}" size="22"></label>'
        '<button type="submit" id="action-backfill">Backfill</button></form>',
        sid=schedule["schedule_id"],
        csrf=csrf,
        f=window["from"],
        t=window["to"],
    )


def timeline_rows(timeline: Mapping[str, Any], local_of: Any) -> Markup:
    entries = timeline["entries"]
    if not entries:
        return Markup('<tr><td colspan="5" class="empty">No expected slot and no occurrence in this window.</td></tr>')
    rows = []
    for entry in reversed(entries):
        links = join(
            (
                render(
                    '<a href="/ui/occurrences/{id}" title="{state} v{v}">{short}</a>',
                    id=o["occurrence_id"],
                    short=o["occurrence_id"][:8],
                    state=o["state"],
                    v=o["version"],
                )
                for o in entry["occurrences"]
            ),
            " ",
        )
        origin = (
            render(' <span class="origin">{o}</span>', o=entry["origin"])
            if entry["origin"] != "schedule"
            else Markup("")
        )
        rows.append(
            render(
                '<tr class="slot" data-verdict="{verdict_raw}" data-slot="{slot}">'
                "<td>{slot}<br><small>{local}</small></td>"
                '<td>{version}</td><td>{verdict}{origin}</td><td class="explanation">{text}</td><td>{links}</td></tr>',
                verdict_raw=entry["verdict"],
                slot=entry["scheduled_for"],
                local=local_of(entry["scheduled_for"]),
                version="v" + str(entry["version"]) if entry["version"] is not None else "—",
                verdict=_verdict(entry["verdict"]),
                origin=origin,
                text=entry["explanation"],
                links=links,
            )
        )
    return join(rows)


def _counts(counts: Mapping[str, int]) -> Markup:
    return join(render('<span class="count">{v} {n}</span>', v=_verdict(k), n=n) for k, n in counts.items())


def timeline_section(timeline: Mapping[str, Any], local_of: Any) -> Markup:
    truncated = (
        Markup('<p class="hint">Only the first slots of this window are shown; narrow it.</p>')
        if timeline["truncated"]
        else Markup("")
    )
    return render(
        '<div class="counts" id="timeline-counts">{counts}</div>{truncated}'
        '<table class="list timeline" id="timeline"><thead><tr><th>Slot (UTC / local)</th><th>Version</th>'
        "<th>What happened</th><th>Why</th><th>Occurrences</th></tr></thead><tbody>{rows}</tbody></table>",
        counts=_counts(timeline["counts"]),
        truncated=truncated,
        rows=timeline_rows(timeline, local_of),
    )


def schedule_page(
    schedule: Mapping[str, Any],
    versions: Sequence[Mapping[str, Any]],
    fires: Sequence[Mapping[str, Any]],
    timeline: Mapping[str, Any],
    window: Mapping[str, str],
    occurrences: Sequence[Mapping[str, Any]],
    principal: Principal,
    csrf: str,
    local_of: Any,
    notice: str | None = None,
) -> Markup:
    sid = schedule["schedule_id"]
    version_rows = join(
        render(
            "<tr><td>v{v}</td><td>{change}</td><td>{state}</td><td>{at}</td><td><code>{summary}</code></td></tr>",
            v=v["version"],
            change=v["change"],
            state=_state(v["state"]),
            at=v["changed_at"],
            summary=_summary(v, versions),
        )
        for v in reversed(versions)
    )
    fire_items = join(
        render(
            "<li>{utc} <small>{local}</small>{dst}</li>",
            utc=f["utc"],
            local=f["local"],
            dst=render(' <span class="dst">{d}</span>', d=f["dst"]) if f.get("dst") else Markup(""),
        )
        for f in fires
    ) or render(
        "<li>{none}</li>",
        none="none: the schedule is " + schedule["state"] if schedule["state"] != "active" else "none",
    )
    occ_rows = join(
        render(
            '<tr><td><a href="/ui/occurrences/{id}">{short}</a></td><td>{slot}</td><td>v{v}</td><td>{state}</td>'
            "<td>{attempts}</td><td>{origin}</td></tr>",
            id=o["occurrence_id"],
            short=o["occurrence_id"][:8],
            slot=o["scheduled_for"],
            v=o["schedule_version"],
            state=_verdict(o["state"]),
            attempts=o["attempt_count"],
            origin=o.get("origin") or "schedule",
        )
        for o in occurrences
    ) or Markup('<tr><td colspan="6" class="empty">No occurrences yet.</td></tr>')
    body = render(
        '{notice}<p class="subtitle"><code id="schedule-id">{sid}</code> {state} v{version} · {when}</p>'
        '<div class="actions">{actions}{backfill}</div>'
        '<section class="card"><h2>Timeline</h2>'
        '<form method="get" action="/ui/schedules/{sid}" class="filters">'
        '<label>From <input name="from" value="{wf}" size="22"></label>'
        '<label>to <input name="to" value="{wt}" size="22"></label><button type="submit">Show</button></form>'
        '<div data-live="timeline" id="timeline-live">{timeline}</div></section>'
        '<div class="split"><section class="card"><h2>Definition</h2>{definition}</section>'
        '<section class="card"><h2>Next fires</h2><ol id="next-fires">{fires}</ol></section></div>'
        '<section class="card"><h2>Versions</h2><table class="list" id="versions"><thead><tr><th>Version</th>'
        "<th>Change</th><th>State</th><th>At</th><th>What changed</th></tr></thead><tbody>{versions}</tbody></table>"
        "</section>"
        '<section class="card"><h2>Recent occurrences</h2><table class="list"><thead><tr><th>Occurrence</th>'
        "<th>Slot</th><th>Version</th><th>State</th><th>Attempts</th><th>Origin</th></tr></thead>"
        '<tbody data-live="occurrences">{occurrences}</tbody></table>'
        '<p><a href="/ui/schedules/{sid}/occurrences">All occurrences →</a></p></section>',
        notice=_notice(notice),
        sid=sid,
        state=_state(schedule["state"]),
        version=schedule["version"],
        when=_when(schedule),
        actions=_actions(schedule, csrf),
        backfill=_backfill_form(schedule, csrf, window),
        definition=_definition(schedule),
        fires=fire_items,
        wf=window["from"],
        wt=window["to"],
        timeline=timeline_section(timeline, local_of),
        versions=version_rows,
        occurrences=occ_rows,
    )
    return layout(f"Schedule → {schedule['target']}", body, principal, csrf, "/ui/schedules")


def occurrence_table(occurrences: Sequence[Mapping[str, Any]]) -> Markup:
    return join(
        render(
            '<tr><td><a href="/ui/occurrences/{id}">{id}</a></td><td>{slot}</td><td>v{v}</td><td>{state}</td>'
            "<td>{attempts}</td><td>{origin}</td><td>{by}</td></tr>",
            id=o["occurrence_id"],
            slot=o["scheduled_for"],
            v=o["schedule_version"],
            state=_verdict(o["state"]),
            attempts=o["attempt_count"],
            origin=o.get("origin") or "schedule",
            by=o.get("requested_by") or "",
        )
        for o in occurrences
    ) or Markup('<tr><td colspan="7" class="empty">No occurrences.</td></tr>')


def occurrences_page(
    schedule: Mapping[str, Any],
    occurrences: Sequence[Mapping[str, Any]],
    next_cursor: str | None,
    principal: Principal,
    csrf: str,
) -> Markup:
    more = (
        render(
            '<p><a href="{href}">Older →</a></p>',
            href=query(f"/ui/schedules/{schedule['schedule_id']}/occurrences", cursor=next_cursor),
        )
        if next_cursor
        else Markup("")
    )
    body = render(
        '<p><a href="/ui/schedules/{sid}">← schedule {short}</a></p><table class="list"><thead><tr>'
        "<th>Occurrence</th><th>Slot</th><th>Version</th><th>State</th><th>Attempts</th><th>Origin</th>"
        "<th>Requested by</th></tr></thead><tbody>{rows}</tbody></table>{more}",
        sid=schedule["schedule_id"],
        short=schedule["schedule_id"][:8],
        rows=occurrence_table(occurrences),
        more=more,
    )
    return layout(f"Occurrences → {schedule['target']}", body, principal, csrf, "/ui/schedules")


def occurrence_page(
    occurrence: Mapping[str, Any],
    attempts: Sequence[Mapping[str, Any]],
    principal: Principal,
    csrf: str,
    notice: str | None = None,
) -> Markup:
    shown = (
        "occurrence_id",
        "schedule_id",
        "schedule_version",
        "tenant_id",
        "target",
        "scheduled_for",
        "available_at",
        "state",
        "attempt_count",
        "origin",
        "requested_by",
        "enqueued_at",
        "finished_at",
        "dead_reason",
        "last_error_class",
        "last_error_message",
    )
    rows = join(
        render("<tr><th>{k}</th><td>{v}</td></tr>", k=k, v=occurrence.get(k) if occurrence.get(k) is not None else "—")
        for k in shown
    )
    attempt_rows = join(
        render(
            "<tr><td>{n}</td><td>{started}</td><td>{finished}</td><td>{result}</td><td>{group}</td>"
            '<td class="error-text">{error}</td></tr>',
            n=a["attempt_number"],
            started=a["started_at"],
            finished=a["finished_at"] or "—",
            result=a["result"] or "running",
            group=a["consumer_group"] or "",
            error=": ".join(x for x in (a["error_class"], a["error_message"]) if x),
        )
        for a in attempts
    ) or Markup('<tr><td colspan="6" class="empty">No attempt reported.</td></tr>')
    replay = (
        render(
            '<form method="post" action="/ui/occurrences/{id}/replay" class="inline">'
            '<input type="hidden" name="csrf_token" value="{csrf}">'
            '<button type="submit" id="action-replay">Replay (same occurrence id)</button></form>',
            id=occurrence["occurrence_id"],
            csrf=csrf,
        )
        if occurrence["state"] == "DEAD"
        else Markup("")
    )
    body = render(
        '{notice}<p><a href="/ui/schedules/{sid}">← schedule</a></p>{replay}<table class="kv">{rows}</table>'
        '<h2>Attempts</h2><table class="list"><thead><tr><th>#</th><th>Started</th><th>Finished</th><th>Result</th>'
        "<th>Consumer group</th><th>Error</th></tr></thead><tbody>{attempts}</tbody></table>",
        notice=_notice(notice),
        sid=occurrence["schedule_id"],
        replay=replay,
        rows=rows,
        attempts=attempt_rows,
    )
    return layout("Occurrence", body, principal, csrf, "/ui/schedules")


def dead_letters_page(page: Mapping[str, Any], principal: Principal, csrf: str, notice: str | None = None) -> Markup:
    rows = join(
        render(
            '<tr><td><a href="/ui/occurrences/{id}">{short}</a></td><td>{tenant}</td><td>{target}</td><td>{slot}</td>'
            '<td>{attempts}</td><td>{reason}</td><td class="error-text">{error}</td><td>{died}</td><td>'
            '<form method="post" action="/ui/occurrences/{id}/replay" class="inline">'
            '<input type="hidden" name="csrf_token" value="{csrf}"><button type="submit" class="replay">Replay</button>'
            "</form></td></tr>",
            id=d["occurrence_id"],
            short=d["occurrence_id"][:8],
            tenant=d["tenant_id"],
            target=d["target"],
            slot=d["scheduled_for"],
            attempts=d["attempts"],
            reason=d["reason"] or "",
            error=": ".join(x for x in (d["error_class"], d["error_message"]) if x),
            died=d["died_at"] or "",
            csrf=csrf,
        )
        for d in page["items"]
    ) or Markup('<tr><td colspan="9" class="empty">No dead letters.</td></tr>')
    more = (
        render('<p><a href="{href}">Next page →</a></p>', href=query("/ui/dead-letters", cursor=page["next_cursor"]))
        if page["next_cursor"]
        else Markup("")
    )
    body = render(
        '{notice}<p class="hint">Occurrences that went DEAD. Replay re-enqueues one with the same occurrence id: a'
        " consumer that had in fact applied it acknowledges it without a second effect.</p>"
        '<table class="list" id="dead-letters"><thead><tr><th>Occurrence</th><th>Tenant</th><th>Target</th>'
        "<th>Slot</th><th>Attempts</th><th>Reason</th><th>Error</th><th>Died</th><th></th></tr></thead>"
        "<tbody>{rows}</tbody></table>{more}",
        notice=_notice(notice),
        rows=rows,
        more=more,
    )
    return layout("Dead letters", body, principal, csrf, "/ui/dead-letters")


def _tenants_table(tenants: Sequence[Mapping[str, Any]]) -> Markup:
    """Every tenant's usage beside its quotas (``every_usage``: the nearest to a quota first), with the share
    of the quota it is nearest to, by which the rows are ranked."""
    rows = join(
        render(
            '<tr data-tenant="{t}"><td>{t}</td><td>{n}</td><td>{share}</td><td>{f}</td><td>{o}</td></tr>',
            t=tenant["tenant_id"],
            n=f"{tenant['usage']['schedules']:,} / {tenant['quotas']['max_active_schedules']:,}",
            share=f"{TenantUsage(**tenant['usage']).nearest_share(TenantQuotas(**tenant['quotas'])):.0%}",
            f=f"{tenant['usage']['fires_per_minute']:,.4g} / {tenant['quotas']['max_fires_per_minute']:,.4g}",
            o=f"{tenant['usage']['open_occurrences']:,} / {tenant['quotas']['max_running']:,}",
        )
        for tenant in tenants
    ) or Markup('<tr><td colspan="5" class="empty">No tenants.</td></tr>')
    return render(
        '<h2>Tenants nearest their quotas</h2><table class="list" id="tenant-usage"><thead><tr><th>Tenant</th>'
        "<th>Live schedules / quota</th><th>Nearest quota used</th><th>Fires per minute / quota</th>"
        "<th>Open occurrences / max running</th></tr></thead><tbody>{rows}</tbody></table>",
        rows=rows,
    )


def health_section(
    health: Mapping[str, Any],
    quota: Mapping[str, Any] | None = None,
    tenants: Sequence[Mapping[str, Any]] | None = None,
) -> Markup:
    """The health tiles and charts; with ``quota`` (a tenant's ``usage_of``), its usage beside its quotas;
    with ``tenants`` (an operator's view), the table of tenants nearest their quotas."""
    lag = health["lag_seconds"]
    b = health["backlogs"]

    def tile(label: str, value: Any, unit: str = "", id_: str = "") -> Markup:
        return render(
            '<div class="tile" id="{id}"><div class="value">{v}{u}</div><div class="label">{l}</div></div>',
            id=id_,
            v="—" if value is None else value,
            u=unit if value is not None else "",
            l=label,
        )

    series = health["series"]
    labels = [point["minute"][11:16] for point in series]
    tiles = join(
        [
            tile("lag p50", lag["p50"], " s", "lag-p50"),
            tile("lag p95", lag["p95"], " s", "lag-p95"),
            tile("lag p99", lag["p99"], " s", "lag-p99"),
            tile("enqueued (hour)", health["enqueued"], "", "enqueued"),
            tile("due schedules", b["due_schedules"], "", "due-backlog"),
            tile("outbox due", b["outbox_due"], "", "outbox-backlog"),
            tile("queue age", b["queue_age_s"], " s", "queue-age"),
            tile("held (overlap)", b["overlap_held"]),
            tile("running", b["running"]),
            tile("retry wait", b["retry_wait"]),
            tile("dead letters", b["dead"], "", "dlq-size"),
            *(
                [
                    tile(
                        "live schedules / quota",
                        f"{quota['usage']['schedules']:,} / {quota['quotas']['max_active_schedules']:,}",
                        "",
                        "quota-schedules",
                    ),
                    tile(
                        "fires per minute / quota",
                        f"{quota['usage']['fires_per_minute']:,.4g} / {quota['quotas']['max_fires_per_minute']:,.4g}",
                        "",
                        "quota-fires",
                    ),
                    tile(
                        "open occurrences / max running",
                        f"{quota['usage']['open_occurrences']:,} / {quota['quotas']['max_running']:,}",
                        "",
                        "quota-running",
                    ),
                ]
                if quota is not None
                else []
            ),
        ]
    )
    charts = join(
        [
            line_chart(
                "Throughput per minute",
                labels,
                [
                    ("enqueued", [p["enqueued"] for p in series]),
                    ("succeeded", [p["succeeded"] for p in series]),
                    ("dead", [p["dead"] for p in series]),
                    ("missed", [p["missed"] for p in series]),
                ],
            ),
            line_chart(
                "schedule_lag per minute",
                labels,
                [("p50", [p["lag_p50"] for p in series]), ("p99", [p["lag_p99"] for p in series])],
                " s",
            ),
        ]
    )
    return render(
        '<div class="tiles">{tiles}</div><div class="charts">{charts}</div>{tenants}'
        '<p class="hint">As of {now}, over the last {m} minutes (by scheduled time), from the engine'
        " database.</p>",
        tiles=tiles,
        charts=charts,
        tenants=_tenants_table(tenants) if tenants is not None else Markup(""),
        now=health["now"],
        m=health["minutes"],
    )


def health_page(
    health: Mapping[str, Any],
    principal: Principal,
    csrf: str,
    quota: Mapping[str, Any] | None = None,
    tenants: Sequence[Mapping[str, Any]] | None = None,
) -> Markup:
    section = health_section(health, quota, tenants)
    body = render('<div data-live="health" id="health-live">{section}</div>', section=section)
    return layout("Health", body, principal, csrf, "/ui/health")


def _summary(version: Mapping[str, Any], versions: Sequence[Mapping[str, Any]]) -> str:
    """What a version changed relative to the one before it."""
    before = next((v for v in versions if v["version"] == version["version"] - 1), None)
    if before is None:
        return "created"
    old, new = before["definition"], version["definition"]
    changed = [f"{k}: {old.get(k)!s} → {new.get(k)!s}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if version["state"] != before["state"]:
        changed.insert(0, f"state: {before['state']} → {version['state']}")
    return "; ".join(changed) or "no definition change"
