"""Counts the XLA compiles a test program runs, at JAX's compile entry point.

The tests' proof that a load replaced a compile: every call of
`compiler.backend_compile_and_load` is one real XLA compile.
"""

from __future__ import annotations

import time

from jax._src import compiler


def count_compiles(slow: tuple[str, ...] = (), slow_secs: float = 0.0) -> list[str]:
    """Start counting; the returned list fills with each compiled module's name.

    Compiles of modules named in `slow` take `slow_secs` longer: a deterministic
    line between programs worth storing and trivial ones.
    """
    compiled: list[str] = []
    real = compiler.backend_compile_and_load

    def counting(backend, computation, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = str(computation.operation.attributes["sym_name"])
        compiled.append(name)
        if any(s in name for s in slow):
            time.sleep(slow_secs)
        return real(backend, computation, *args, **kwargs)

    compiler.backend_compile_and_load = counting
    return compiled
