"""Choosing the embedded broker: the kinds, and the errors that say what is wrong before anything starts."""

from pathlib import Path

import pytest

from engine.cli.embedded.brokers import BROKER_KINDS, apache_kafka_unavailable, broker_kind, start_broker
from schemas.errors import StackError


def test_the_kinds_are_tansu_and_apache_and_anything_else_is_named_in_the_error() -> None:
    assert BROKER_KINDS == ("tansu", "apache")
    assert broker_kind("apache") == "apache"
    with pytest.raises(StackError, match="unknown broker kind 'kafka': choose one of tansu, apache"):
        broker_kind("kafka")


def test_broker_properties_for_tansu_are_refused_not_ignored(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="tansu takes no broker properties"):
        start_broker("tansu", tmp_path, {"log.flush.interval.messages": "1"})


def test_apache_kafka_without_java_or_jars_says_which_and_how_to_get_it(tmp_path: Path) -> None:
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    no_jars = {"JAVA_HOME": str(tmp_path / "jdk"), "CHRONOQ_KAFKA_JARS": str(tmp_path / "none")}
    assert "`chronoq kafka fetch`" in (apache_kafka_unavailable(no_jars) or "")
    no_java = {"PATH": str(tmp_path), "CHRONOQ_KAFKA_JARS": str(tmp_path / "none")}
    assert "Java 17 or newer" in (apache_kafka_unavailable(no_java) or "")
