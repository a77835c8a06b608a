import os

import pytest

from engine.cli import endpoints as stack_endpoints
from schemas.errors import StackError


def test_no_env_means_embedded_stack():
    assert stack_endpoints.external_endpoints({}) is None


def test_both_urls_select_the_external_stack_and_consumer_db_defaults_to_it():
    endpoints = stack_endpoints.external_endpoints(
        {"CHRONOQ_DATABASE_URL": "postgresql://db/x", "CHRONOQ_KAFKA_BOOTSTRAP": "k:9092"}
    )
    assert endpoints is not None
    assert endpoints.database_url == "postgresql://db/x"
    assert endpoints.kafka_bootstrap == "k:9092"
    assert endpoints.consumer_database_url == "postgresql://db/x"


def test_half_configured_external_stack_is_an_error_naming_the_missing_variable():
    with pytest.raises(StackError, match="CHRONOQ_KAFKA_BOOTSTRAP"):
        stack_endpoints.external_endpoints({"CHRONOQ_DATABASE_URL": "postgresql://db/x"})


def test_state_file_round_trip_and_liveness(tmp_path):
    state = stack_endpoints.StackState(
        pid=os.getpid(), database_url="postgresql://a", kafka_bootstrap="b:1", consumer_database_url="postgresql://c"
    )
    stack_endpoints.write_state(state, tmp_path)
    assert stack_endpoints.read_state(tmp_path) == state
    env = {"CHRONOQ_HOME": str(tmp_path)}
    assert stack_endpoints.resolve_endpoints(env).kafka_bootstrap == "b:1"


def test_state_of_a_dead_process_is_ignored(tmp_path):
    dead_pid = 2**22 + 12345  # above the default pid_max: never a live process
    stack_endpoints.write_state(
        stack_endpoints.StackState(dead_pid, "postgresql://a", "b:1", "postgresql://c"), tmp_path
    )
    assert stack_endpoints.read_state(tmp_path) is None
    with pytest.raises(StackError, match="chronoq up"):
        stack_endpoints.resolve_endpoints({"CHRONOQ_HOME": str(tmp_path)})


def test_a_consumer_needs_only_kafka_and_its_own_database():
    endpoints = stack_endpoints.resolve_consumer_endpoints(
        {"CHRONOQ_KAFKA_BOOTSTRAP": "k:9092", "CHRONOQ_CONSUMER_DATABASE_URL": "postgresql://app/db"}
    )
    assert endpoints.consumer_database_url == "postgresql://app/db" and endpoints.database_url == ""


def test_database_only_commands_need_only_the_database_url(tmp_path):
    # chronoq api, migrate, tenant, schedule and dlq never contact Kafka: a database URL alone is enough.
    assert stack_endpoints.resolve_database_url({"CHRONOQ_DATABASE_URL": "postgresql://db/x"}) == "postgresql://db/x"
    state = stack_endpoints.StackState(
        pid=os.getpid(), database_url="postgresql://a", kafka_bootstrap="b:1", consumer_database_url="postgresql://c"
    )
    stack_endpoints.write_state(state, tmp_path)
    assert stack_endpoints.resolve_database_url({"CHRONOQ_HOME": str(tmp_path)}) == "postgresql://a"
    with pytest.raises(StackError, match="CHRONOQ_DATABASE_URL"):
        stack_endpoints.resolve_database_url({"CHRONOQ_KAFKA_BOOTSTRAP": "k:9092"})


@pytest.mark.parametrize("kind, idempotent", [("tansu", False), ("apache", True)])
def test_a_running_stack_says_which_broker_it_runs_and_whether_the_relay_may_be_idempotent(tmp_path, kind, idempotent):
    # tansu has no InitProducerId: an idempotent relay could not even start on it.
    state = stack_endpoints.StackState(
        pid=os.getpid(),
        database_url="postgresql://a",
        kafka_bootstrap="b:1",
        consumer_database_url="postgresql://c",
        kafka_kind=kind,
    )
    stack_endpoints.write_state(state, tmp_path)
    endpoints = stack_endpoints.resolve_endpoints({"CHRONOQ_HOME": str(tmp_path)})
    assert (endpoints.kafka_kind, endpoints.idempotent_producer) == (kind, idempotent)


def test_an_external_broker_is_idempotent_only_when_told():
    external = {"CHRONOQ_DATABASE_URL": "postgresql://db/x", "CHRONOQ_KAFKA_BOOTSTRAP": "k:9092"}
    plain = stack_endpoints.external_endpoints(external)
    told = stack_endpoints.external_endpoints({**external, "CHRONOQ_KAFKA_IDEMPOTENT": "1"})
    assert plain is not None and told is not None
    assert (plain.idempotent_producer, told.idempotent_producer) == (False, True)
    assert plain.kafka_kind == "external"
    with pytest.raises(StackError, match="CHRONOQ_KAFKA_IDEMPOTENT is 'sometimes': use 1 or 0"):
        stack_endpoints.external_endpoints({**external, "CHRONOQ_KAFKA_IDEMPOTENT": "sometimes"})


@pytest.mark.parametrize(
    "kind, session, fetch_wait", [("tansu", 2.0, 0.05), ("apache", 10.0, 0.5), ("external", 10.0, 0.5)]
)
def test_the_cli_consumers_wait_briefly_at_a_tansu_broker_only(kind, session, fetch_wait):
    """tansu answers a waiting fetch of several partitions only when the wait runs out (docs/broker.md): the
    CLI's consumers (``chronoq consume``, the demo) ask for a short one there; Kafka's default elsewhere."""
    from engine.cli.consume_command import consumer_config

    endpoints = stack_endpoints.Endpoints("postgresql://a", "b:1", "postgresql://c", kafka_kind=kind)
    cfg = consumer_config(endpoints, "printer")
    cfg.validate()
    assert (cfg.session_timeout, cfg.fetch_wait) == (session, fetch_wait)
