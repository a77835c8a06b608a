"""schemathesis hooks for ``load_tests.api_fuzz``: schedule ids in paths point at schedules that exist.

Without them the fuzzer's ``{id}`` is a random uuid (404), or, along the document's links, a schedule an
earlier step canceled (409, final state): in a 200-example run pause, resume and trigger never reached a
2xx and PATCH did 6 times in 218, so the generated bodies of those operations were never judged against a
live schedule. ``api_fuzz`` creates schedules for the fuzz tenant before the run and names them in
``CHRONOQ_FUZZ_LIVE`` (comma-separated ids; cancel takes its own set from ``CHRONOQ_FUZZ_DOOMED``, so
cancels do not use up the live ones); occurrence paths (read, replay) take DEAD occurrences from
``CHRONOQ_FUZZ_DEAD``. Hypothesis chooses between the generated id and one of those, so a
seed still reproduces a run. Loaded by the schemathesis CLI through ``SCHEMATHESIS_HOOKS`` (this file's path).
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis
from hypothesis import strategies as st


def _ids(variable: str) -> list[str]:
    return [value for value in os.environ.get(variable, "").split(",") if value]


LIVE, DOOMED, DEAD = _ids("CHRONOQ_FUZZ_LIVE"), _ids("CHRONOQ_FUZZ_DOOMED"), _ids("CHRONOQ_FUZZ_DEAD")


@schemathesis.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A schedule operation's ``id``: the generated value or (four times in five) an existing schedule; an
    occurrence operation's: the generated value or a DEAD occurrence (replay's own subject)."""
    operation = context.operation
    path = operation.path if operation is not None else ""
    if path.startswith("/v1/occurrences/{id}"):
        pool = DEAD
    elif path.startswith("/v1/schedules/{id}"):
        pool = DOOMED if path.endswith("/cancel") else LIVE
    else:
        pool = []
    if not pool or not path_parameters or "id" not in path_parameters:  # None: the path has no parameters
        return st.just(path_parameters)
    existing = st.sampled_from(pool).map(lambda schedule_id: {**path_parameters, "id": schedule_id})
    return st.one_of(st.just(path_parameters), existing, existing, existing, existing)  # a branch, uniformly
