"""The materializer's tenant hold (engine/loops/tenant_gate.py hold_rows): exactly the rows beyond a tenant's
room are held, the earliest due admitted first, whichever tenants overflow and whichever do not."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.loops.tenant_gate import StagedColumns, hold_rows

# A staging row cut down to what the hold reads and writes: id, tenant, available_at, state, held (by the
# overlap gate), ahead, late_after, misfire_policy, tenant_held.
COLUMNS = StagedColumns(
    tenant_id=1, available_at=2, state=3, held=4, ahead=5, late_after=6, misfire_policy=7, tenant_held=8
)
T0 = datetime(2026, 12, 6, 15, tzinfo=UTC)


def reference(staged: list[tuple[Any, ...]], candidates: list[int], room: dict[str, int]) -> list[tuple[Any, ...]]:
    """Every candidate in due order, each admitted while its tenant has room: the rule, without shortcuts."""
    left, out = dict(room), list(staged)
    for i in sorted(candidates, key=lambda i: (staged[i][2], staged[i][0])):
        tenant = staged[i][1]
        if tenant not in left:
            continue
        if left[tenant] > 0:
            left[tenant] -= 1
            continue
        row = list(staged[i])
        row[5], row[6], row[7], row[8] = False, None, None, True
        out[i] = tuple(row)
    return out


rows = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 30), st.booleans()), min_size=0, max_size=60
)


@settings(max_examples=300)
@given(rows, st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 20)))
def test_the_rows_beyond_each_tenants_room_are_held_earliest_due_first(drawn, room):
    staged = [
        (n, tenant, T0 + timedelta(seconds=second), "SCHEDULED", False, ahead, T0, "skip", False)
        for n, (tenant, second, ahead) in enumerate(drawn)
    ]
    candidates = list(range(len(staged)))
    out, held = hold_rows(staged, candidates, dict(room), COLUMNS)
    assert out == reference(staged, candidates, room)
    assert held == Counter(row[1] for row in out if row[8])
