"""Counts the XLA compiles a test program runs, at JAX's compile entry point.

The tests' proof that a load replaced a compile: every call of
`compiler.backend_compile_and_load` is one real XLA compile.
"""

from __future__ import annotations

from jax._src import compiler


def count_compiles() -> list[str]:
    """Start counting; the returned list fills with each compiled module's name."""
    compiled: list[str] = []
    real = compiler.backend_compile_and_load

    def counting(backend, computation, *args, **kwargs):  # type: ignore[no-untyped-def]
        compiled.append(str(computation.operation.attributes["sym_name"]))
        return real(backend, computation, *args, **kwargs)

    compiler.backend_compile_and_load = counting
    return compiled
