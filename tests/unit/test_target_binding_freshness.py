"""When a refused occurrence must be re-checked against the target-binding topic, and what a record's
binding version decides (pure rules)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from consumers.target_bindings import Admission, admission_of, needs_catch_up
from schemas.target_bindings import TargetBindingMessage

AT = datetime(2026, 12, 1, tzinfo=UTC)

instants = st.integers(min_value=0, max_value=2**48)
maybe_instants = st.none() | instants
margins = st.integers(min_value=0, max_value=10_000)


@given(st.sampled_from([True, None]), maybe_instants, maybe_instants, margins)
def test_a_yes_is_never_rechecked(verdict, appended, fresh, margin):
    assert not needs_catch_up(verdict, appended, fresh, margin)


@given(maybe_instants, maybe_instants, margins)
def test_a_no_is_rechecked_unless_a_read_began_a_margin_after_the_record(appended, fresh, margin):
    recheck = needs_catch_up(False, appended, fresh, margin)
    if appended is None or fresh is None:
        assert recheck
    else:
        assert recheck == (fresh < appended + margin)


@given(instants, instants, margins, st.integers(min_value=0, max_value=10_000))
def test_a_later_read_never_makes_a_recheck_necessary_again(appended, fresh, margin, later):
    # Freshness only grows: once a read answers for a record, every later read does too.
    if not needs_catch_up(False, appended, fresh, margin):
        assert not needs_catch_up(False, appended, fresh + later, margin)


# -- records stamped with their target's binding version (admission_of) ------------------------------------

tenants = st.sampled_from(["acme", "globex", "initech"])
versions = st.integers(min_value=1, max_value=2**31 - 1)
bindings = st.builds(
    lambda tenant_set, version: TargetBindingMessage("billing.invoice", tuple(sorted(tenant_set)), version, AT),
    st.sets(tenants, min_size=1),
    versions,
)


@given(st.none() | bindings, tenants, st.none() | versions)
def test_a_bound_tenant_or_an_unbound_target_is_admitted_whatever_the_version(binding, tenant, version):
    if binding is None or tenant in binding.tenants:
        assert admission_of(binding, tenant, version) is Admission.ALLOWED


@given(bindings, tenants, versions)
def test_an_absent_tenant_is_refused_only_by_a_view_that_has_the_records_version(binding, tenant, version):
    if tenant in binding.tenants:
        return
    expected = Admission.REFUSED if binding.version >= version else Admission.BEHIND
    assert admission_of(binding, tenant, version) is expected


@given(bindings, tenants)
def test_a_record_without_a_version_leaves_an_absent_tenant_to_the_freshness_rule(binding, tenant):
    if tenant not in binding.tenants:
        assert admission_of(binding, tenant, None) is None


@given(bindings, tenants, versions, st.integers(min_value=0, max_value=1000))
def test_a_newer_view_never_turns_a_refusal_back_into_behind(binding, tenant, version, later):
    """Monotonic: once refused at view version v, every view version above v refuses too (same tenants)."""
    newer = TargetBindingMessage(binding.target, binding.tenants, binding.version + later, AT)
    if admission_of(binding, tenant, version) is Admission.REFUSED:
        assert admission_of(newer, tenant, version) is Admission.REFUSED
