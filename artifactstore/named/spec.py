"""`NamedSpec`: one named executable for `artstore warm MODULE:FUNCTION` to build.

CI lists these (e.g. `fold` at every sequence length, for each target fingerprint)
so that workers and services only ever load: `artstore warm` builds and stores the
native executable and its portable form, or finds them present.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from artifactstore.named import keys


class NamedSpec:
    """`fn` compiled for `specs` under NAME@VERSION (the arguments of `compiled`)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *specs: Any,
        name: str,
        version: str,
        static_argnums: int | Sequence[int] = (),
        platforms: str | Sequence[str] | None = None,
    ) -> None:
        self.fn = fn
        self.specs = specs
        self.name = keys.check_name(name)
        self.version = keys.check_version(version)
        self.static_argnums = static_argnums
        self.platforms = keys.check_platforms(platforms)  # of the portable form

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def __repr__(self) -> str:
        return f"NamedSpec({self.ref})"
