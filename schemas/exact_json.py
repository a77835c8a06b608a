"""JSON text read without changing a number.

orjson, chronoq's parser, reads an integer literal that does not fit 64 bits as a float, silently: a payload
of ``{"order": 123456789012345678901234567890}`` would be stored, published and handed to the app as
``1.2345678901234568e+29``. Where chronoq accepts JSON from outside (the API's bodies, the command topic,
the console's payload field, the CLI's ``--payload`` and import files), such a number is refused instead,
naming where it is, so nothing accepted changes on its way. Integers within 64 bits (signed, or unsigned up
to 2**64 - 1) and floats are read exactly by the engine, by consumer apps (orjson) and by most JSON
libraries; larger integers travel as strings.

Pure, no I/O. The check costs one scan of the text for a run of 19 digits (no shorter integer literal can
leave 64 bits) and, only when there is one, a second parse with the standard library, which keeps every
integer exact.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from schemas.errors import InvalidInput

#: The integers every reader of a payload keeps exactly: signed and unsigned 64-bit.
SMALLEST, LARGEST = -(2**63), 2**64 - 1
#: What to send instead, for an error's example.
AS_STRING = '"123456789012345678901234567890"'
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


class InexactNumber(ValueError):
    """An integer literal outside 64 bits: ``path`` says where (``["payload"]["order"]``), ``top`` is its
    first key (the field to name in an error), ``literal`` its first digits."""

    def __init__(self, path: str, top: str, number: int) -> None:
        text = str(number)
        self.path, self.top = path, top
        self.literal = text if len(text) <= 40 else text[:37] + "..."
        super().__init__(
            f"holds the integer {self.literal} at {path or '(the value)'}, which does not fit 64 bits: JSON readers"
            " (chronoq's and most apps') would change it into an approximate float; send it as a string"
        )


def check_exact(raw: bytes | bytearray | memoryview | str) -> None:
    """Raise :class:`InexactNumber` if valid JSON text ``raw`` holds an integer literal outside 64 bits (the
    first one found, depth first); anything else, including text that is not JSON, passes (parse it first)."""
    data = raw.encode() if isinstance(raw, str) else bytes(raw)
    if _LONG_DIGITS.search(data) is None:
        return
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, or nested past the standard parser: the caller's parse says
        return
    stack: list[tuple[Any, str, str]] = [(value, "", "")]
    while stack:
        item, path, top = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool):
            if not SMALLEST <= item <= LARGEST:
                raise InexactNumber(path, top, item)
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                stack.append((child, f"{path}[{str(key)[:30]!r}]", top or str(key)))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{index}]", top) for index, child in reversed(list(enumerate(item))))


def loads_exact(raw: bytes | bytearray | memoryview | str) -> Any:
    """``orjson.loads(raw)``, whose ``orjson.JSONDecodeError`` it raises as is, or :class:`InexactNumber` for
    an integer literal it would have changed."""
    value = orjson.loads(raw)
    check_exact(raw)
    return value


def field_json(raw: bytes | str, field: str, example: str | None = None) -> Any:
    """The JSON value of a field given as text (a console form's, a CLI flag's, an import file's line), or
    :class:`~schemas.errors.InvalidInput` naming ``field``: not JSON, or an integer it would change."""
    try:
        return loads_exact(raw)
    except orjson.JSONDecodeError as err:
        raise InvalidInput(field, f"is not valid JSON ({err})", example) from err
    except InexactNumber as err:
        raise InvalidInput(field, str(err), example) from err
