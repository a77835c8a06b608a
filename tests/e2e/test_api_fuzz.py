"""API fuzzing: schemathesis generates valid and invalid requests from /openapi.json
against a real `chronoq api` process; no request may produce a 5xx."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from engine.api.openapi import openapi_document
from engine.control.tenants import create_tenant

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("CHRONOQ_FUZZ_EXAMPLES", "25"))


@pytest.fixture
async def api_process(engine_db, pool):
    token = (await create_tenant(pool, "fuzz")).api_token
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOQ_")}
    env.update(CHRONOQ_DATABASE_URL=engine_db)  # and no Kafka bootstrap: the API never contacts Kafka
    process = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "api", "--api-port", "0"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    line = await asyncio.to_thread(process.stdout.readline)
    assert line.startswith("chronoq api on "), process.stderr.read() if process.poll() is not None else line
    yield line.split(" on ", 1)[1].strip(), token
    process.terminate()
    await asyncio.to_thread(process.communicate, timeout=30)


async def test_no_generated_request_produces_a_server_error(api_process):
    base_url, token = api_process
    schema = schemathesis.openapi.from_dict(openapi_document())
    failures: list[str] = []

    def fuzz(operation, mode) -> None:
        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case) -> None:
            response = case.call(base_url=base_url, headers={"Authorization": f"Bearer {token}"})
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} {case.body!r:.200} -> "
                    f"{response.status_code} {response.text[:200]}"
                )

        check()

    def run_all() -> int:
        operations = 0
        for result in schema.get_all_operations():
            operation = result.ok()  # type: ignore[union-attr]  # an invalid operation fails the test
            operations += 1
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                fuzz(operation, mode)
        return operations

    operations = await asyncio.to_thread(run_all)
    # The 13 of the control plane, the 4 operator routes (batch, backfill, trigger, timeline) and the 8 of
    # calendars and previews (calendars: create, list, get, update, delete, import, versions; schedule preview).
    assert operations == 25
    assert not failures, "\n".join(failures[:20])
