"""Structural contracts: dependency direction, named queries, migrations."""

import ast
from pathlib import Path

import pytest

from schemas.migrations import MIGRATION_SETS, load_migrations
from schemas.queries import load_queries
from schemas.topics import occurrence_topic, validate_target
from schemas.errors import InvalidInput

ROOT = Path(__file__).resolve().parents[2]
OURS = {"engine", "relay", "consumers", "schemas"}


def imported_packages(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text())
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names & OURS
    return found


@pytest.mark.parametrize("package, allowed", [
    ("schemas", {"schemas"}),
    ("relay", {"relay", "schemas"}),
    ("consumers", {"consumers", "schemas"}),
])
def test_dependencies_point_one_way(package, allowed):
    offenders = {path: sorted(names - allowed) for path, names in imported_packages(package).items()
                 if names - allowed}
    assert not offenders, f"{package} must not import {offenders}"


def test_only_the_composition_root_wires_engine_to_other_rooms():
    # engine modules may use relay/consumers only where components are wired together.
    offenders = {path for path, names in imported_packages("engine").items()
                 if names & {"relay", "consumers"}
                 and not (path.startswith("engine/cli/") or path == "engine/loops/service.py")}
    assert not offenders


@pytest.mark.parametrize("room", ["engine", "relay", "consumer"])
def test_named_queries_parse(room):
    queries = load_queries(room)
    assert queries
    for name, sql in queries.items():
        assert sql.rstrip().endswith(";"), f"{room}.{name} should end with ';'"


@pytest.mark.parametrize("migration_set", MIGRATION_SETS)
def test_migrations_are_contiguous(migration_set):
    migrations = load_migrations(migration_set)
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))


def test_no_sql_files_escape_the_schemas_package():
    stray = [p for p in ROOT.rglob("*.sql") if "schemas" not in p.parts and ".venv" not in p.parts]
    assert not stray


@pytest.mark.parametrize("bad", ["", "has space", "-leading", "x" * 101, "slash/target", "ümlaut", None, 7])
def test_invalid_targets_are_rejected_with_the_field_named(bad):
    with pytest.raises(InvalidInput) as caught:
        validate_target(bad)
    assert caught.value.field == "target"


def test_targets_become_topics():
    assert occurrence_topic("billing.invoice") == "chronoq.occurrences.billing.invoice"
