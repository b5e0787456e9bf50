"""The check before a module is served: it and XLA on the same generated inputs.

Inputs of the declared shapes and dtypes come from a seeded generator (floats from a
normal distribution, integers in a small range, booleans at random); every output is
compared with a tolerance stated per dtype: |module - XLA| <= atol + rtol * scale, where
scale is the output's largest magnitude in XLA's result (a sum computed in another order
differs by rounding that grows with its terms, not with its result: an element near zero
of a large matmul differs by as much as the large ones). Exact for integers and
booleans; NaN and infinities must sit where XLA's are.

A module that compiled may still be wrong: one small program of ordinary operations
came out wrong from IREE 3.13's llvm-cpu target while every other output of it agreed,
so no module is stored unchecked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from artifactstore.named.signature import Leaf, Signature, Tree

# dtype -> (relative, absolute) tolerance of |module - xla| <= atol + rtol * max |xla|.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
}
EXACT = (0.0, 0.0)


def tolerance(dtype: str) -> tuple[float, float]:
    return TOLERANCES.get(dtype, EXACT)


def generate(leaves: Sequence[Leaf], seed: int = 0) -> list[Any]:
    """One array per leaf, of its shape and dtype, the same for the same seed."""
    import numpy as np

    from artifactstore.native.loader import numpy_dtype

    rng = np.random.default_rng(seed)
    out = []
    for leaf in leaves:
        dtype = numpy_dtype(leaf.dtype)
        value: Any
        if leaf.dtype == "bool":
            value = rng.random(leaf.shape) < 0.5
        elif leaf.dtype.startswith("uint"):
            value = rng.integers(0, 8, leaf.shape)
        elif leaf.dtype.startswith("int"):
            value = rng.integers(-8, 8, leaf.shape)
        else:
            value = rng.standard_normal(leaf.shape)
        out.append(np.ascontiguousarray(np.asarray(value).astype(dtype)))
    return out


def leaf_paths(tree: Tree, path: str = "result") -> Iterator[str]:
    """The path of each leaf of `tree`, in flattening order (`result[0]['h']`)."""
    if tree == "*":
        yield path
    elif isinstance(tree, dict):
        ((kind, body),) = tree.items()
        if kind == "dict":
            for key, child in body:
                yield from leaf_paths(child, f"{path}[{key!r}]")
        elif kind in ("tuple", "list"):
            for i, child in enumerate(body):
                yield from leaf_paths(child, f"{path}[{i}]")


def compare(outputs: Signature, got: Sequence[Any], want: Sequence[Any]) -> list[dict[str, Any]]:
    """Per output: its path, dtype, the largest difference, the tolerance, and `ok`."""
    import numpy as np

    rows = []
    paths = list(leaf_paths(outputs.tree)) or [f"result[{i}]" for i in range(len(want))]
    for i, (path, leaf) in enumerate(zip(paths, outputs.leaves, strict=True)):
        rtol, atol = tolerance(leaf.dtype)
        row: dict[str, Any] = {"output": path, "dtype": leaf.dtype, "rtol": rtol, "atol": atol}
        a = np.asarray(got[i]) if i < len(got) else None
        b = np.asarray(want[i])
        if a is None or a.shape != b.shape:
            shape = None if a is None else list(a.shape)
            rows.append({**row, "ok": False, "max_diff": None, "got_shape": shape})
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        same_special = np.array_equal(np.isnan(a64), np.isnan(b64)) and np.array_equal(
            a64[np.isinf(b64)], b64[np.isinf(b64)]
        )
        finite = np.isfinite(b64) & np.isfinite(a64)
        diff = np.abs(a64 - b64)[finite]
        scale = float(np.abs(b64[finite]).max()) if diff.size else 0.0
        worst = float(diff.max()) if diff.size else 0.0
        ok = bool(same_special and worst <= atol + rtol * scale)
        rows.append({**row, "ok": ok, "max_diff": worst, "scale": scale})
    return rows


def against(
    module: Callable[[Sequence[Any]], list[Any]],
    xla: Callable[[Sequence[Any]], list[Any]],
    signature: tuple[Signature, Signature],
    seed: int | Sequence[Any] = 0,
) -> list[dict[str, Any]]:
    """`module` and `xla` (each: flat inputs -> flat outputs) on inputs generated from
    `seed` for `signature`'s (inputs, outputs), or on the arrays given, compared output
    by output."""
    inputs, outputs = signature
    if isinstance(seed, int):
        arrays = generate(inputs.leaves, seed)
    else:
        arrays = [_fit(a, leaf) for a, leaf in zip(seed, inputs.leaves, strict=True)]
    want = xla(arrays)
    got = module(arrays)
    if len(got) != len(want):
        return [{"output": "result", "ok": False, "max_diff": None, "count": len(got)}]
    return compare(outputs, got, want)


def _fit(value: Any, leaf: Leaf) -> Any:
    """`value` as the module takes it; ValueError where it is not of `leaf`'s shape."""
    import numpy as np

    from artifactstore.native.loader import numpy_dtype

    array = np.ascontiguousarray(np.asarray(value, dtype=numpy_dtype(leaf.dtype)))
    if array.shape != leaf.shape:
        raise ValueError(f"a check input of shape {array.shape}, not {leaf.describe()}")
    return array


def disagreement(rows: Sequence[dict[str, Any]]) -> str:
    """What the failed rows say, in one line."""
    bad = [r for r in rows if not r["ok"]]
    parts = []
    for r in bad[:5]:
        diff = r.get("max_diff")
        if diff is None:
            parts.append(f"{r['output']}: wrong shape or count")
        else:
            parts.append(
                f"{r['output']} ({r.get('dtype')}): max |diff| {diff:.3g} over tolerance "
                f"atol {r.get('atol')} + rtol {r.get('rtol')} x scale {r.get('scale', 0):.3g}"
            )
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return "; ".join(parts) + more
