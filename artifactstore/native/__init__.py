"""Named functions as native modules: compiled by IREE, checked against XLA, served.

Without JAX (importing them loads none): `iree` (the optional IREE packages, or one
line saying what to install), `target` (which CPU a module is built for, and whether
this host has it), `convention` (the calling convention stored with each module),
`fetch` (the store's portable form and modules, through the session's lookup chain),
`runner` (a module run by IREE's runtime) and `loader` (`load(NAME, version=)`: a
callable over numpy arrays). With JAX: `lower` (the portable StableHLO lowered for the
CPU, and what cannot go native), `check` (the module against XLA on generated inputs)
and `builder` (`build(NAME, version=)`: lower, compile, check, store).
"""

from __future__ import annotations

from typing import Any

__all__ = ["build", "load"]


def __getattr__(name: str) -> Any:
    """`load` without JAX; `build` (which imports JAX) only when asked for."""
    if name == "load":
        from artifactstore.native.loader import load

        return load
    if name == "build":
        from artifactstore.native.builder import build

        return build
    raise AttributeError(name)
