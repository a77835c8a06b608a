"""The Apache Kafka jar cache and the launcher's preconditions, without Maven Central or a JVM.

A stand-in ``mvn`` on PATH plays Maven here (it writes a jar where
``-DoutputDirectory`` points, or fails like a resolution error), so these
tests check what chronoq decides — when a cache counts as complete, that an
interrupted copy is redone, that a failure leaves nothing half-written —
and not Maven. The real fetch runs in CI before the integration tests.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from engine.cli.embedded import apache_kafka
from engine.cli.embedded.apache_kafka import (
    COMPLETE_MARKER,
    KAFKA_VERSION,
    ApacheKafka,
    fetch,
    fetched,
    jars_directory,
    java_binary,
)
from schemas.errors import StackError

FAKE_MVN = """#!/bin/sh
echo run >> "{calls}"
if [ -n "$FAKE_MVN_FAIL" ]; then
  echo "[ERROR] Failed to execute goal: Could not resolve dependencies for project"
  exit 1
fi
for arg in "$@"; do
  case "$arg" in
    -DoutputDirectory=*) out="${{arg#-DoutputDirectory=}}" ;;
  esac
done
echo jar > "$out/kafka_2.13-{version}.jar"
echo jar > "$out/kafka-clients-{version}.jar"
"""


@pytest.fixture
def fake_mvn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in mvn first on PATH; returns the file that counts its runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "mvn-calls"
    script = bin_dir / "mvn"
    script.write_text(FAKE_MVN.format(calls=calls, version=KAFKA_VERSION))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("FAKE_MVN_FAIL", raising=False)
    return calls


def runs(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_the_cache_defaults_under_the_home_directory_and_follows_the_environment(tmp_path: Path) -> None:
    assert jars_directory({}) == Path.home() / ".cache" / "chronoq" / f"kafka-{KAFKA_VERSION}"
    assert jars_directory({"CHRONOQ_KAFKA_JARS": str(tmp_path / "jars")}) == (tmp_path / "jars").resolve()


def test_jars_without_the_marker_or_with_another_poms_marker_are_not_a_complete_fetch(tmp_path: Path) -> None:
    (tmp_path / f"kafka_2.13-{KAFKA_VERSION}.jar").write_text("jar")
    assert not fetched(tmp_path)  # an interrupted copy: jars, no marker
    (tmp_path / COMPLETE_MARKER).write_text("pom-sha256 0000\n")
    assert not fetched(tmp_path)  # fetched for another pom (another Kafka version or binding)
    assert not fetched(tmp_path / "absent")


def test_fetch_replaces_an_interrupted_copy_and_reuses_a_complete_one(tmp_path: Path, fake_mvn: Path) -> None:
    destination = tmp_path / "cache" / f"kafka-{KAFKA_VERSION}"
    destination.mkdir(parents=True)
    (destination / "half-written.jar").write_text("partial")

    assert fetch(destination) == destination.resolve()
    assert fetched(destination)
    assert sorted(p.name for p in destination.glob("*.jar")) == [
        f"kafka-clients-{KAFKA_VERSION}.jar",
        f"kafka_2.13-{KAFKA_VERSION}.jar",
    ]
    assert (destination / COMPLETE_MARKER).read_text().splitlines()[1:] == [
        f"kafka-clients-{KAFKA_VERSION}.jar",
        f"kafka_2.13-{KAFKA_VERSION}.jar",
    ]
    assert runs(fake_mvn) == 1

    fetch(destination)
    assert runs(fake_mvn) == 1, "a complete fetch was redone"
    assert [p.name for p in destination.parent.iterdir()] == [destination.name], "a staging directory was left"


def test_a_failed_maven_run_says_why_and_leaves_nothing_behind(
    tmp_path: Path, fake_mvn: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MVN_FAIL", "1")
    destination = tmp_path / "cache" / "kafka"
    with pytest.raises(StackError, match="Could not resolve dependencies"):
        fetch(destination)
    assert not destination.exists()
    assert list(destination.parent.iterdir()) == []


def test_fetch_without_maven_names_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StackError, match=r"Maven \(mvn\) is not on PATH"):
        fetch(tmp_path / "jars")


def test_java_comes_from_java_home_first_then_path(tmp_path: Path) -> None:
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    assert java_binary({"JAVA_HOME": str(tmp_path / "jdk"), "PATH": ""}) == str(java)
    assert java_binary({"PATH": str(java.parent)}) == str(java)
    with pytest.raises(StackError, match="JAVA_HOME is .*not an executable java"):
        java_binary({"JAVA_HOME": str(tmp_path / "nowhere"), "PATH": str(java.parent)})
    with pytest.raises(StackError, match="Java 17 or newer"):
        java_binary({"PATH": str(tmp_path)})


def test_starting_without_the_jars_says_how_to_fetch_them(tmp_path: Path) -> None:
    broker = ApacheKafka(tmp_path / "data", jars=tmp_path / "no-jars", java="/bin/false")
    with pytest.raises(StackError, match=r"`chronoq kafka fetch`"):
        broker.start()
    assert broker.pid is None


def test_the_broker_settings_file_ships_beside_the_launcher() -> None:
    # compose.yaml mounts the same file; the Maven project and logging
    # configuration are package data too (pyproject.toml).
    for resource in (apache_kafka.POM, apache_kafka.SERVER_PROPERTIES, apache_kafka.LOG4J_CONFIG):
        assert resource.is_file(), resource
    settings = dict(
        line.split("=", 1)
        for line in apache_kafka.SERVER_PROPERTIES.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert settings["auto.create.topics.enable"] == "false"
    assert settings["log.flush.interval.messages"] == "1"
    assert settings["min.insync.replicas"] == "1"


def test_compose_runs_the_tested_kafka_version_with_the_tested_properties() -> None:
    compose = (Path(__file__).resolve().parents[2] / "compose.yaml").read_text()
    assert f"image: apache/kafka:{KAFKA_VERSION}\n" in compose
    assert "- ./engine/cli/embedded/apache_kafka/server.properties:/mnt/shared/config/server.properties:ro" in compose


def test_compose_runs_the_relay_with_the_idempotent_producer() -> None:
    compose = (Path(__file__).resolve().parents[2] / "compose.yaml").read_text()
    assert '    CHRONOQ_KAFKA_IDEMPOTENT: "1"\n' in compose
