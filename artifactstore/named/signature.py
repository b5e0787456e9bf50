"""The call signature of a named executable, in a declarative format (never pickle).

JAX's own serializer pickles tree structures, so loading its bytes can run any
Python. Here a tree is plain JSON: `null` (None), `"*"` (an array leaf),
`{"tuple": [...]}`, `{"list": [...]}`, `{"dict": [[key, child], ...]}` (keys in
JAX's sorted order) and `{"static": value}` (a static argument, baked into the
executable). Leaves are `{"shape": [...], "dtype": "float32", "sharding": ...}` in
JAX's flattening order. Only these containers are accepted, matched by exact type:
a namedtuple or a registered custom node would need its class to rebuild, which
is code. A mismatch at call time is a `NamedCallError` naming the first path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from artifactstore.errors import ArtstoreError

Tree = Any  # None | "*" | {"tuple"|"list": [Tree]} | {"dict": [[str, Tree]]} | {"static": v}
_STATIC_TYPES = (bool, int, float, str, type(None))
_PY_SCALARS = {bool: "b", int: "if", float: "f", complex: "c"}


class NamedCallError(ArtstoreError, TypeError):
    """Arguments that do not match the named executable's stored signature."""


class UnsupportedTree(ArtstoreError, TypeError):
    """A function whose inputs or outputs cannot be described declaratively."""


@dataclass(frozen=True)
class Leaf:
    """One array argument or result: what the executable was compiled for."""

    shape: tuple[int, ...]
    dtype: str
    sharding: dict[str, Any] | None = None

    def describe(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "sharding": self.sharding}

    @classmethod
    def from_json(cls, data: Any) -> Leaf:
        if not isinstance(data, dict) or not isinstance(data.get("dtype"), str):
            raise ValueError(f"malformed leaf {data!r}")
        shape = data.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"malformed shape {shape!r}")
        sharding = data.get("sharding")
        if sharding is not None and not isinstance(sharding, dict):
            raise ValueError(f"malformed sharding {sharding!r}")
        return cls(tuple(shape), data["dtype"], sharding)


@dataclass(frozen=True)
class Signature:
    """A tree and its leaves: the inputs (a tuple of positional arguments) or the outputs."""

    tree: Tree
    leaves: tuple[Leaf, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"tree": self.tree, "leaves": [leaf.to_json() for leaf in self.leaves]}

    @classmethod
    def from_json(cls, data: Any) -> Signature:
        if not isinstance(data, dict) or not isinstance(data.get("leaves"), list):
            raise ValueError("malformed signature")
        tree = data.get("tree")
        count = _check_tree(tree)
        leaves = tuple(Leaf.from_json(leaf) for leaf in data["leaves"])
        if count != len(leaves):
            raise ValueError(f"signature has {count} leaf slots but {len(leaves)} leaves")
        return cls(tree, leaves)

    def describe(self) -> str:
        leaves = iter(self.leaves)
        return _describe(self.tree, leaves)

    # -- building -----------------------------------------------------------
    @classmethod
    def of(
        cls,
        value: Any,
        leaf: Callable[[Any], Leaf],
        *,
        path: str,
        static: Callable[[str], bool] = lambda _p: False,
    ) -> Signature:
        """The signature of `value` (e.g. ShapeDtypeStructs in containers); `leaf`
        describes an array, `static(path)` says which positions are static."""
        leaves: list[Leaf] = []
        tree = _encode(value, leaf, leaves, path, static)
        return cls(tree, tuple(leaves))

    # -- calling ------------------------------------------------------------
    def flatten(
        self, value: Any, *, path: str, check: Callable[[Any, Leaf, str], Any]
    ) -> list[Any]:
        """The leaves of `value` in order, after checking its structure against the
        tree and each leaf with `check(leaf_value, spec, path)` (which returns the
        value to pass on). Raises NamedCallError at the first mismatch."""
        out: list[Any] = []
        _flatten(self.tree, value, iter(self.leaves), out, path, check)
        return out

    def unflatten(self, leaves: Sequence[Any]) -> Any:
        """`leaves` put back into the tree (outputs)."""
        it = iter(leaves)
        value = _build(self.tree, it)
        if next(it, _END) is not _END:
            raise ValueError("more leaves than the tree holds")
        return value

    def static_values(self) -> list[tuple[int, Any]]:
        """(position, value) of the static arguments of an input signature."""
        items = self.tree.get("tuple", []) if isinstance(self.tree, dict) else []
        return [
            (i, t["static"]) for i, t in enumerate(items) if isinstance(t, dict) and "static" in t
        ]


_END = object()


def _encode(
    value: Any,
    leaf: Callable[[Any], Leaf],
    leaves: list[Leaf],
    path: str,
    static: Callable[[str], bool],
) -> Tree:
    if static(path):
        if not isinstance(value, _STATIC_TYPES):
            raise UnsupportedTree(
                f"{path}: a static argument must be a bool, int, float, str or None, "
                f"got {type(value).__name__}"
            )
        json.dumps(value)  # NaN and friends are fine for json; this only proves it encodes
        return {"static": value}
    if value is None:
        return None
    kind = type(value)
    if kind is tuple:
        return {
            "tuple": [_encode(v, leaf, leaves, f"{path}[{i}]", static) for i, v in enumerate(value)]
        }
    if kind is list:
        return {
            "list": [_encode(v, leaf, leaves, f"{path}[{i}]", static) for i, v in enumerate(value)]
        }
    if kind is dict:
        if not all(isinstance(k, str) for k in value):
            raise UnsupportedTree(f"{path}: dict keys must be strings")
        return {
            "dict": [
                [k, _encode(value[k], leaf, leaves, f"{path}[{k!r}]", static)]
                for k in sorted(value)
            ]
        }
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        leaves.append(leaf(value))
        return "*"
    raise UnsupportedTree(
        f"{path}: a {kind.__module__}.{kind.__qualname__} cannot be stored declaratively; "
        "named executables take arrays in dicts, tuples, lists and None (convert custom "
        "pytree nodes, namedtuples and dataclasses to dicts at the boundary)"
    )


def _check_tree(tree: Tree) -> int:
    """The number of leaf slots in `tree`; ValueError when it is not a valid tree."""
    if tree is None:
        return 0
    if tree == "*":
        return 1
    if isinstance(tree, dict) and len(tree) == 1:
        ((kind, body),) = tree.items()
        if kind in ("tuple", "list") and isinstance(body, list):
            return sum(_check_tree(t) for t in body)
        if kind == "dict" and isinstance(body, list):
            keys = []
            total = 0
            for item in body:
                if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                    raise ValueError("malformed dict node")
                keys.append(item[0])
                total += _check_tree(item[1])
            if keys != sorted(set(keys)):
                raise ValueError("dict keys not sorted or repeated")
            return total
        if kind == "static" and isinstance(body, _STATIC_TYPES):
            return 0
    raise ValueError(f"malformed tree node {tree!r}")


def _describe(tree: Tree, leaves: Iterator[Leaf]) -> str:
    if tree is None:
        return "None"
    if tree == "*":
        return next(leaves).describe()
    ((kind, body),) = tree.items()
    if kind == "static":
        return f"static {body!r}"
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {_describe(t, leaves)}" for k, t in body) + "}"
    inner = ", ".join(_describe(t, leaves) for t in body)
    if kind == "tuple":
        return f"({inner}{',' if len(body) == 1 else ''})"
    return f"[{inner}]"


def _kind_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _flatten(
    tree: Tree,
    value: Any,
    leaves: Iterator[Leaf],
    out: list[Any],
    path: str,
    check: Callable[[Any, Leaf, str], Any],
) -> None:
    if tree is None:
        if value is not None:
            raise NamedCallError(f"{path}: expected None, got {_kind_name(value)}")
        return
    if tree == "*":
        out.append(check(value, next(leaves), path))
        return
    ((kind, body),) = tree.items()
    if kind == "static":
        if value != body or type(value) is not type(body):
            raise NamedCallError(
                f"{path}: a static argument; this executable was built for {body!r}, got {value!r}"
            )
        return
    if kind == "dict":
        if type(value) is not dict:
            raise NamedCallError(f"{path}: expected a dict, got {_kind_name(value)}")
        want = [k for k, _ in body]
        if sorted(value, key=str) != want:
            missing = [k for k in want if k not in value]
            extra = sorted(str(k) for k in value if k not in want)
            detail = f"missing {missing}" if missing else f"unexpected {extra}"
            raise NamedCallError(f"{path}: dict keys differ: {detail}")
        for k, child in body:
            _flatten(child, value[k], leaves, out, f"{path}[{k!r}]", check)
        return
    expected = tuple if kind == "tuple" else list
    if type(value) is not expected:
        raise NamedCallError(f"{path}: expected a {kind}, got {_kind_name(value)}")
    if len(value) != len(body):
        raise NamedCallError(f"{path}: expected {len(body)} items, got {len(value)}")
    for i, (child, item) in enumerate(zip(body, value, strict=True)):
        _flatten(child, item, leaves, out, f"{path}[{i}]", check)


def _build(tree: Tree, leaves: Iterator[Any]) -> Any:
    if tree is None:
        return None
    if tree == "*":
        return next(leaves)
    ((kind, body),) = tree.items()
    if kind == "static":
        return body
    if kind == "dict":
        return {k: _build(t, leaves) for k, t in body}
    items = [_build(t, leaves) for t in body]
    return tuple(items) if kind == "tuple" else items


def check_array(value: Any, spec: Leaf, path: str) -> None:
    """Raise NamedCallError unless `value` (an array or a Python scalar) fits `spec`."""
    kind = type(value)
    if kind in _PY_SCALARS:
        if spec.shape != ():
            raise NamedCallError(
                f"{path}: expected {spec.describe()}, got a Python {kind.__name__}"
            )
        if _dtype_kind(spec.dtype) not in _PY_SCALARS[kind]:
            raise NamedCallError(
                f"{path}: expected {spec.describe()}, got a Python {kind.__name__}"
            )
        return
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        raise NamedCallError(
            f"{path}: expected an array {spec.describe()}, got {_kind_name(value)}"
        )
    got = f"{dtype}[{','.join(map(str, tuple(shape)))}]"
    if tuple(shape) != spec.shape or str(dtype) != spec.dtype:
        raise NamedCallError(f"{path}: expected {spec.describe()}, got {got}")


def _dtype_kind(dtype: str) -> str:
    if dtype == "bool":
        return "b"
    if dtype.startswith(("int", "uint")):
        return "i"
    if dtype.startswith("complex"):
        return "c"
    return "f"
