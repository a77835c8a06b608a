"""The API fuzz run's summary: a 5xx and an operation schemathesis could not fuzz both make it unclean."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from load_tests.api_fuzz import summarize


def _scenario(method: str, path: str, status: int, mode: str = "positive", body: bytes = b"") -> dict:
    case = {"value": {"method": method, "path": path, "meta": {"generation": {"mode": mode}}}}
    response = {"status_code": status, "content": {"$base64": base64.b64encode(body).decode()}}
    return {"ScenarioFinished": {"recorder": {"cases": {"c1": case}, "interactions": {"c1": {"response": response}}}}}


def test_statuses_server_errors_and_the_tools_own_errors_are_counted(tmp_path: Path) -> None:
    events = [
        _scenario("GET", "/v1/schedules", 200),
        _scenario("PATCH", "/v1/schedules/{id}", 409),
        _scenario("POST", "/v1/schedules", 500, body=b"boom"),
        {"NonFatalError": {"label": "GET /v1/calendars", "phase": "fuzzing",
                           "value": {"type": "TypeError", "message": "argument of type 'NoneType' is not iterable"}}},
    ]  # fmt: skip
    ndjson = tmp_path / "events.ndjson"
    ndjson.write_text("\n".join(json.dumps(event) for event in events))

    figures = summarize(ndjson)

    assert figures["total_requests"] == 3
    assert figures["requests"]["PATCH /v1/schedules/{id}"] == {"4xx": 1}
    assert figures["positive_outcomes"]["GET /v1/schedules"] == {"accepted": 1}
    assert figures["server_errors"] == ["POST /v1/schedules -> 500: boom"]
    assert figures["tool_errors"] == [
        "GET /v1/calendars (fuzzing): TypeError: argument of type 'NoneType' is not iterable"
    ]
