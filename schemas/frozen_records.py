"""Frozen dataclasses that are cheap to build: :func:`quick_init`.

A frozen dataclass's generated ``__init__`` sets every field through ``object.__setattr__`` (the
class's own ``__setattr__`` refuses), about 0.35 µs per field here: 5 µs for the 14 fields of an
attempt event against 0.9 µs for a plain dataclass. The hot path builds several such records per
occurrence — the decoded message, the handler's ``Occurrence``, the ``started`` and ``succeeded``
events, the engine's answer — so a consumer app paid ~15 µs per occurrence for the guarantee alone
(docs/benchmarks.md, "Where the handler path's CPU goes").

:func:`quick_init` gives such a class an ``__init__`` with the same signature, defaults and
``__post_init__`` call that fills the instance's ``__dict__`` in one update. Everything else the
dataclass generated stays: equality, hashing, ``repr``, ``dataclasses.replace`` (which calls
``__init__``), and the refusal of later assignment. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

T = TypeVar("T")


def quick_init(cls: type[T]) -> type[T]:
    """Replace the ``__init__`` of frozen dataclass ``cls`` by one that sets its fields in one step.

    Guarantee: for any arguments, the instance (its fields, equality, hash) and any exception are those of
    the dataclass's own ``__init__``, kept as ``cls.__dataclass_init__`` for tests to compare with.
    Refused (TypeError) for what the quick form does not handle: a class that is not a frozen dataclass,
    has ``__slots__`` (no instance dict), keyword-only or ``init=False`` fields, or ``InitVar`` pseudo-fields.
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"{cls.__name__} is not a frozen dataclass")
    if "__slots__" in cls.__dict__:
        raise TypeError(f"{cls.__name__} has __slots__: quick_init fills the instance dict")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # checked above: a dataclass
    # The generated __init__ must take exactly the fields, in order, positional or keyword: that rules
    # out InitVar pseudo-fields (extra parameters), init=False fields (missing ones) and keyword-only ones.
    generated = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if [(p.name, p.kind) for p in generated] != [(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for f in fields]:
        raise TypeError(f"{cls.__name__}: quick_init takes classes whose __init__ takes exactly their fields")
    namespace: dict[str, Any] = {"_NO_VALUE": _NO_VALUE}
    signature, defaults_from_factories = [], []
    for f in fields:
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            signature.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            signature.append(f"{f.name}=_NO_VALUE")
            defaults_from_factories.append(f"    if {f.name} is _NO_VALUE:\n        {f.name} = _factory_{f.name}()\n")
        else:
            signature.append(f.name)
    values = ", ".join(f"{f.name!r}: {f.name}" for f in fields)
    post_init = "    self.__post_init__()\n" if hasattr(cls, "__post_init__") else ""
    source = (
        f"def __init__(self, {', '.join(signature)}):\n"
        + "".join(defaults_from_factories)
        + f"    self.__dict__.update({{{values}}})\n"
        + post_init
    )
    exec(source, namespace)  # noqa: S102 - the source is built above from the class's own field names
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    cls.__dataclass_init__ = cls.__init__  # type: ignore[attr-defined]
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


class _NoValue:
    """The default of a field with a default factory: no caller passes it (module-private)."""

    def __repr__(self) -> str:
        return "<no value>"


_NO_VALUE = _NoValue()
