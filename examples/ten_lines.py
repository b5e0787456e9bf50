"""The README's ten lines: run it twice; the second process loads every executable.

    python examples/ten_lines.py            # the embedded store (a local directory + SQLite)
    ARTSTORE_URL=s3://team-jax/cache python examples/ten_lines.py

The bundled compile-heavy program that `artstore demo` and the benchmarks run is
`python -m artifactstore.examples.compile_heavy` (it ships inside the package, so it
runs from any directory, this checkout's root included).
"""

import jax
import jax.numpy as jnp

import artifactstore

# Every compile is stored here, even quick ones: by default a compile under 0.1 s is not
# (loading it would save nothing), and on a fast CPU each of this step's compiles is.
artifactstore.configure(min_compile_secs=0)  # or configure("s3://team-jax/cache", index=...)


def loss(w: jax.Array, x: jax.Array) -> jax.Array:
    for _ in range(12):  # a deep graph: XLA takes a while to compile it, once
        x = jnp.tanh(x @ w)
    return jnp.mean(x**2)


print(jax.jit(jax.grad(loss))(jnp.eye(128), jnp.ones((32, 128))).sum())
# Uploads run in the background (the program never waits for the store): wait for them
# here, so that `stored` counts every executable stored, as `artstore ls` will list them.
artifactstore.flush()
print(artifactstore.process_stats())
