"""A row of the settings table, and the immutable record whose attributes the rows are.

A setting is one `Var` assigned in the body of `table.Settings`: its variable, keyword,
type, default, parser and meaning in one place. As a descriptor it gives the class a
typed attribute (mypy reads its type from the default and the parser), so a new setting
is one row and nothing else: `resolve` parses it, the reference shows it, `Settings`
has it, with its default where none is given.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from artifactstore.config import defaults as d
from artifactstore.config import values as v
from artifactstore.redact import redact

T = TypeVar("T")


class _Given:
    def __repr__(self) -> str:
        return "GIVEN"


# The default of a row that `resolve` always fills, from several variables at once
# (where the store lives): there is none of its own to fall back on.
GIVEN: Any = _Given()


@dataclass(frozen=True)
class Var(Generic[T]):
    """One `ARTSTORE_*` variable. A setting has a `keyword` (its `configure()` argument)
    and a `parse` (variable name, given value, default -> the value), except where
    `resolve` parses rows together (the URLs, the metrics), and is an attribute of
    `Settings` (its `attr`); the other variables (`keyword` None) are read where they
    act, `internal` ones set by us for our children."""

    name: str  # after ARTSTORE_
    keyword: str | None
    kind: str  # what a value looks like, for the reference
    default: T
    doc: str
    parse: v.Parse[T] | None = None
    shown: str = ""  # the default as the reference says it, where not `default` itself
    internal: bool = False
    secret: bool = False  # a key: never in a repr
    attr: str = field(default="", init=False, compare=False)  # its Settings attribute

    @property
    def env(self) -> str:
        return d.ENV_PREFIX + self.name

    def __set_name__(self, owner: type, name: str) -> None:
        object.__setattr__(self, "attr", name)

    @overload
    def __get__(self, instance: None, owner: type) -> Var[T]: ...

    @overload
    def __get__(self, instance: object, owner: type) -> T: ...

    def __get__(self, instance: object | None, owner: type) -> Var[T] | T:
        """The row on the class; on a record (which holds each value itself, found
        before this), the default."""
        return self if instance is None else self.default


class Record:
    """Immutable values of the `Var` rows of a subclass's body (and of its other
    annotated attributes, which have class defaults), compared and hashed by value, its
    repr redacted (a program that prints its settings must not print a password)."""

    def __init__(self, **values: Any) -> None:
        names = {row.attr for row in self.rows()} | set(self._extras())
        unknown = sorted(set(values) - names)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no {unknown[0]!r}")
        missing = [r.attr for r in self.rows() if r.default is GIVEN and r.attr not in values]
        if missing:
            raise TypeError(f"{type(self).__name__} needs {', '.join(missing)}")
        self.__dict__.update(values)

    @classmethod
    def rows(cls) -> tuple[Var[Any], ...]:
        """The rows, in the order of the class bodies (a base's first)."""
        found = {n: r for k in reversed(cls.__mro__) for n, r in vars(k).items()}
        return tuple(row for row in found.values() if isinstance(row, Var))

    @classmethod
    def _extras(cls) -> list[str]:
        """The annotated attributes that are not rows (each with a class default)."""
        names = [n for k in reversed(cls.__mro__) for n in inspect.get_annotations(k)]
        return [n for n in dict.fromkeys(names) if not isinstance(getattr(cls, n), Var)]

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._names())

    def _names(self) -> list[str]:
        return [row.attr for row in self.rows()] + self._extras()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record) or type(other) is not type(self):
            return False
        return other._values() == self._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        hidden = {row.attr for row in self.rows() if row.secret}
        shown = [f"{n}={getattr(self, n)!r}" for n in self._names() if n not in hidden]
        return redact(f"{type(self).__name__}({', '.join(shown)})")
