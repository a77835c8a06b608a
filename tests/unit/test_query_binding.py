"""``bind_parameters`` (one compiled scan) agrees with the character-by-character loop it replaced.

The loop below is the specification: it reads the SQL one character at a time, stepping over quoted
strings and identifiers, comments, dollar-quoted strings and casts, and numbers each ``:name`` in the order
of first use. The scan must return the same SQL and names, or raise the same error, on any text.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from schemas.queries import bind_parameters, query_files

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def reference_bind(text: str) -> tuple[str, tuple[str, ...]]:
    out: list[str] = []
    names: list[str] = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char in ("'", '"'):
            end = _quoted_end(text, i, char)
        elif text.startswith("--", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif char == "$" and (tag := re.match(r"\$[A-Za-z_]*\$", text[i:])):
            close = text.find(tag.group(0), i + len(tag.group(0)))
            end = n if close < 0 else close + len(tag.group(0))
        elif text.startswith("::", i):
            end = i + 2
        elif char == ":" and (match := _IDENTIFIER.match(text, i + 1)):
            name = match.group(0)
            if name not in names:
                names.append(name)
            out.append(f"${names.index(name) + 1}")
            i = match.end()
            continue
        else:
            end = i + 1
        out.append(text[i:end])
        i = end
    return "".join(out), tuple(names)


def _quoted_end(text: str, start: int, quote: str) -> int:
    i = start + 1
    while i < len(text):
        if text[i] == quote:
            if text.startswith(quote * 2, i):
                i += 2
                continue
            return i + 1
        i += 1
    raise ValueError(f"unterminated {quote} at character {start}")


#: The pieces SQL text is made of where the two could disagree: every token's opening and closing, and
#: the characters a parameter name may or may not start or continue with.
FRAGMENTS = ["'", "''", '"', "--", "/*", "*/", "$$", "$a$", "$b$", "$", "$1", ":", "::", ":x", ":ab", ":_1"]
FRAGMENTS += ["a", "x", "_", "9", "E", " ", "\n", "*", "/", "-", ";", "(", ")", ","]


def outcome(bind, text: str) -> tuple[str, tuple[str, ...]] | str:
    try:
        return bind(text)
    except ValueError as err:
        return f"ValueError: {err}"


@settings(max_examples=3000)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join))
@example("-- :not_me\nSELECT ':nor_me', \"col:umn\", $$ :nor $$, :a::int, :b, :a /* :c */ FROM t WHERE x = :b;")
@example("SELECT 'it''s :not', E'x''y', :a")
@example("SELECT $a$ :no $b$ :still_no $a$ :yes")
@example("SELECT ':open")
@example("/* :never closed")
def test_the_scan_agrees_with_the_character_loop(text):
    assert outcome(bind_parameters, text) == outcome(reference_bind, text)


def test_every_shipped_query_file_binds_as_the_loop_binds():
    for file in query_files():
        text = resources.files("schemas").joinpath("queries", f"{file}.sql").read_text()
        assert bind_parameters(text) == reference_bind(text), file


def test_an_unterminated_quote_is_reported_with_its_position():
    with pytest.raises(ValueError, match="unterminated ' at character 7"):
        bind_parameters("SELECT 'oops")
