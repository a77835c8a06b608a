"""Log lines for people and grep: ``time level logger message key=value...``.

Every state transition logs a stable ``action`` field plus the ids it
concerns (occurrence_id, schedule_id, tenant_id), passed as ``extra``.
"""

from __future__ import annotations

import logging
import sys

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extras = " ".join(f"{key}={value}" for key, value in record.__dict__.items() if key not in _STANDARD)
        return f"{base} {extras}" if extras else base


def configure_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger("chronoq")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
