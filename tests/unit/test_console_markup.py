"""The console's HTML is escaped by default; its pages and charts render hostile text inert."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given
from hypothesis import strategies as st

from engine.api.console import pages
from engine.api.console.charts import line_chart
from engine.api.console.markup import Markup, join, query, render
from engine.api.console.preview import dst_change, preview_with_dst
from engine.api.console.sessions import Principal
from engine.control.quotas import TenantQuotas, TenantUsage

HOSTILE = '<script>alert("x")</script>\'"&'


def test_values_are_escaped_and_markup_is_not_escaped_twice():
    inner = render("<b>{v}</b>", v=HOSTILE)
    assert inner == "<b>&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&#x27;&quot;&amp;</b>"
    assert render("<p>{x}</p>", x=inner) == "<p>" + inner + "</p>"
    assert join(["<i>", Markup("<i>")]) == "&lt;i&gt;<i>"
    assert render('<a title="{t}">', t='" onmouseover="x') == '<a title="&quot; onmouseover=&quot;x">'


@given(st.text())
def test_no_text_can_open_a_tag_or_leave_an_attribute(text):
    out = render('<td title="{t}">{t}</td>', t=text)
    body = out[len('<td title="') : -len("</td>")]
    assert "<" not in body and '"' not in body.split(">", 1)[1]


def test_urls_are_encoded():
    assert query("/ui/schedules", q="a&b=c", state=None) == "/ui/schedules?q=a%26b%3Dc"


def test_pages_render_hostile_schedules_inert():
    schedule = {
        "schedule_id": "6b0c0000-0000-0000-0000-000000000000",
        "tenant_id": "acme",
        "target": HOSTILE,
        "kind": "cron",
        "expression": HOSTILE,
        "time_zone": "UTC",
        "state": "active",
        "version": 1,
        "next_run_at": None,
    }
    principal = Principal(operator="alice")
    html = pages.schedules_page([schedule], None, {"q": HOSTILE}, {}, principal, "csrf")
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    timeline = {
        "entries": [
            {
                "scheduled_for": "2026-11-29T10:00:00Z",
                "verdict": "DEAD",
                "explanation": HOSTILE,
                "version": 1,
                "origin": "schedule",
                "occurrences": [],
            }
        ],
        "counts": {"DEAD": 1},
        "truncated": False,
    }
    section = pages.timeline_section(timeline, lambda text: text)
    assert "<script>alert" not in section


def test_charts_are_inline_svg_with_escaped_labels():
    svg = line_chart(HOSTILE, ["10:00", "10:01", "10:02"], [("a<b", [1.0, None, 3.0])])
    assert svg.startswith('<figure class="chart"><svg') and "<script" not in svg
    assert "a&lt;b" in svg and "<circle" in svg  # a lone point after a gap is drawn as a dot


def test_dst_days_are_marked_in_the_preview():
    berlin = ZoneInfo("Europe/Berlin")
    assert dst_change(berlin, datetime(2027, 3, 28, 12, tzinfo=berlin)) == timedelta(hours=1)
    assert dst_change(berlin, datetime(2027, 10, 31, 12, tzinfo=berlin)) == timedelta(hours=-1)
    assert dst_change(berlin, datetime(2027, 3, 27, 12, tzinfo=berlin)) is None
    fires = preview_with_dst(
        {"kind": "cron", "expression": "30 2 * * *", "time_zone": "Europe/Berlin"},
        datetime(2027, 10, 30, 0, tzinfo=UTC),
        3,
    )
    assert [f["utc"] for f in fires] == ["2027-10-30T00:30:00Z", "2027-10-31T00:30:00Z", "2027-11-01T01:30:00Z"]
    assert [f["dst"] for f in fires] == [None, "DST day: clocks fall back 1h", None]


def _tenant(tenant_id: str, schedules: int, fires: float, open_occurrences: int = 0) -> dict:
    """A row of ``every_usage``: quotas of 1,000 schedules, 100 fires per minute and 50 running."""
    quotas = asdict(TenantQuotas(max_active_schedules=1000, max_fires_per_minute=100.0, max_running=50))
    usage = {"schedules": schedules, "fires_per_minute": fires, "open_occurrences": open_occurrences}
    return {"tenant_id": tenant_id, "quotas": quotas, "usage": usage}


def test_the_tenant_table_shows_the_share_of_the_quota_each_tenant_is_nearest_to():
    """Ranked by the larger share (read_tenants_usage): the column shows that share, so a tenant near its rate
    quota with few schedules does not read 1 % at the top of the table."""
    html = str(pages._tenants_table([_tenant("hot", 10, 95.0), _tenant("many", 900, 1.0)]))
    hot, many = html.split('data-tenant="hot"')[1], html.split('data-tenant="many"')[1]
    assert "<td>95%</td>" in hot.split("</tr>")[0] and "<td>90%</td>" in many.split("</tr>")[0]


def test_the_tenant_table_shows_open_occurrences_against_max_running():
    html = str(pages._tenants_table([_tenant("busy", 10, 1.0, open_occurrences=1234)]))
    assert "<th>Open occurrences / max running</th>" in html
    assert html.split('data-tenant="busy"')[1].split("</tr>")[0].endswith("<td>1,234 / 50</td>")


@given(st.integers(0, 10**6), st.floats(0, 1e6), st.integers(0, 10**6), st.floats(0, 1e6))
def test_the_nearest_share_is_the_larger_of_the_two(schedules, fires, max_schedules, max_fires):
    share = TenantUsage(schedules, fires).nearest_share(TenantQuotas(max_schedules, max_fires))
    assert share >= schedules / max(max_schedules, 1) and share >= fires / max(max_fires, 1e-9)
    assert share in (schedules / max(max_schedules, 1), fires / max(max_fires, 1e-9))
