"""Calling a named executable as fast as `jax.jit` calls its own.

A loaded executable is handed to JAX as the result of compiling a stub with the same
flat inputs, outputs and shardings (`compile.provided`): JAX wraps it in a `Compiled`,
whose C++ call path checks shapes, dtypes and shardings and places arguments for each
call as jit's does. A call whose argument tree matches the stored one (one C++ tree
flatten and a comparison) goes there; anything else (another structure, Python
scalars of another kind, arrays JAX refuses) takes the checked path, which names the
first mismatch (`NamedCallError`) or places the arguments itself.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from artifactstore.errors import CorruptObject, NamedNotFound, one_line
from artifactstore.jaxhook import compile as _compile
from artifactstore.named import container
from artifactstore.named.signature import Leaf, NamedCallError, UnsupportedTree, check_array
from artifactstore.process.background import executor

log = logging.getLogger("artifactstore")

_SLOW = object()  # the fast path declines this call: take the checked one
STUB_NAME = "artifactstore_named_call"


class NamedExecutable:
    """A compiled function loaded by name: call it like the jitted function.

    Positional arguments only, in the structure, shapes and dtypes it was built
    for (static arguments with the values it was built for); anything else is a
    NamedCallError naming the first mismatch. `source` says how it came here:
    `store` (loaded), `portable` (rebuilt from StableHLO) or `compiled` (built now).
    """

    def __init__(self, header: container.Header, executable: Any, source: str) -> None:
        import jax

        self.name = header.name
        self.version = header.version
        self.header = header
        self.source = source
        self._executable = executable
        devices = {d.id: d for d in executable.local_devices()}
        self._in_shardings = [sharding_from_json(leaf, devices) for leaf in header.inputs.leaves]
        self._out_shardings = [sharding_from_json(leaf, devices) for leaf in header.outputs.leaves]
        self._assemble = jax.make_array_from_single_device_arrays
        self._device_put = jax.device_put
        self._array = jax.Array
        # Set up beside the program (a stub's trace, some ms per hundred leaves), so the
        # first call never waits for it; calls take the checked path until it is ready.
        # Joined at exit: one still tracing when the interpreter finalizes would abort the
        # process ("terminate called without an active exception").
        self._fast: _FastCall | None = None
        self._ready = threading.Event()
        try:
            executor().submit(self._set_up_fast, "named call set-up", joined=True)
        except RuntimeError:  # the interpreter is exiting: the checked path serves
            self._ready.set()

    def _set_up_fast(self) -> None:
        try:
            self._fast = _FastCall.build(self)
        finally:
            self._ready.set()

    @property
    def in_signature(self) -> Any:
        return self.header.inputs

    @property
    def out_signature(self) -> Any:
        return self.header.outputs

    @property
    def fast(self) -> bool:
        """Whether calls go through JAX's C++ call path (waits until that is known)."""
        self._ready.wait(60)
        return self._fast is not None

    def __repr__(self) -> str:
        return (
            f"<named executable {self.name}@{self.version} ({self.source}): "
            f"{self.header.inputs.describe()} -> {self.header.outputs.describe()}>"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fast = self._fast
        if fast is not None and not kwargs:
            result = fast(args)
            if result is not _SLOW:
                return result
        return self.call_checked(*args, **kwargs)

    def call_checked(self, *args: Any, **kwargs: Any) -> Any:
        """Check every argument against the signature, place it, run: the path that
        names a mismatch, and the one every call takes where the fast path is off."""
        if kwargs:
            raise NamedCallError(
                f"{self.name}@{self.version} takes positional arguments only; "
                f"got keywords {sorted(kwargs)}"
            )
        shardings = iter(self._in_shardings)

        def place(value: Any, spec: Leaf, path: str) -> Any:
            check_array(value, spec, path)
            target = next(shardings)
            if isinstance(value, self._array) and value.sharding == target:
                return value
            return self._device_put(_as_array(value, spec.dtype), target)

        flat = self.header.inputs.flatten(tuple(args), path="args", check=place)
        results = self._executable.execute_sharded(flat)
        parts = results.disassemble_into_single_device_arrays()
        outs = [
            self._assemble(leaf.shape, sharding, arrays)
            for leaf, sharding, arrays in zip(
                self.header.outputs.leaves, self._out_shardings, parts, strict=True
            )
        ]
        return self.header.outputs.unflatten(outs)


class _FastCall:
    """The executable as JAX's `Compiled` for the dynamic arguments' trees: a call is
    its static arguments compared, then JAX's C++ path (one flatten, every check)."""

    def __init__(self, compiled: Any, named: NamedExecutable) -> None:
        self.compiled = compiled
        self.statics = named.header.inputs.static_values()
        self.count = _arity(named)
        positions = {i for i, _ in self.statics}
        self.dynamic = [i for i in range(self.count) if i not in positions]

    @classmethod
    def build(cls, named: NamedExecutable) -> _FastCall | None:
        """None where this JAX cannot wrap the executable (the checked path serves)."""
        import jax
        import jax.numpy as jnp

        inputs, outputs = named.header.inputs, named.header.outputs
        specs = inputs.unflatten(
            [
                jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s)  # type: ignore[no-untyped-call]
                for leaf, s in zip(inputs.leaves, named._in_shardings, strict=True)
            ]
        )
        static = {i for i, _ in inputs.static_values()}
        dynamic = [spec for i, spec in enumerate(specs) if i not in static]

        def stub(*_args: Any) -> Any:
            return outputs.unflatten([jnp.zeros(leaf.shape, leaf.dtype) for leaf in outputs.leaves])

        stub.__name__ = STUB_NAME  # JAX's compile events name it (not the user's function)
        try:
            out_shardings = outputs.unflatten(named._out_shardings)
            jitted = jax.jit(stub, keep_unused=True, out_shardings=out_shardings)
            with _compile.provided(named._executable):
                compiled = jitted.lower(*dynamic).compile()
            return cls(compiled, named)
        except Exception as exc:  # an unforeseen JAX: every call takes the checked path
            log.debug(
                "artifactstore: %s@%s: no fast call path (%s)",
                named.name,
                named.version,
                one_line(exc),
            )
            return None

    def __call__(self, args: tuple[Any, ...]) -> Any:
        if len(args) != self.count:
            return _SLOW
        if self.statics:
            for i, value in self.statics:
                if args[i] != value or type(args[i]) is not type(value):
                    return _SLOW
            args = tuple(args[i] for i in self.dynamic)
        try:
            return self.compiled(*args)
        except (TypeError, ValueError):  # raised before running: trees, types, shardings
            return _SLOW


def _arity(named: NamedExecutable) -> int:
    tree = named.header.inputs.tree
    return len(tree.get("tuple", [])) if isinstance(tree, dict) else 0


def sharding_to_json(sharding: Any, name: str) -> dict[str, Any]:
    from jax.sharding import NamedSharding

    devices = sorted(sharding.device_set, key=lambda d: d.id)
    memory_kind = getattr(sharding, "memory_kind", None)
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
        spec = [list(p) if isinstance(p, tuple) else p for p in sharding.spec]
        return {
            "kind": "named",
            "mesh_shape": [int(n) for n in mesh.devices.shape],
            "axis_names": [str(a) for a in mesh.axis_names],
            "devices": [int(d.id) for d in mesh.devices.flat],
            "spec": spec,
            "memory_kind": memory_kind,
        }
    if len(devices) == 1:
        return {"kind": "single", "device": int(devices[0].id), "memory_kind": memory_kind}
    raise UnsupportedTree(
        f"{name}: a {type(sharding).__name__} cannot be stored; give the specs "
        "jax.sharding.NamedSharding shardings"
    )


def sharding_from_json(leaf: Leaf, devices: dict[int, Any]) -> Any:
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

    data = leaf.sharding or {}
    try:
        if data.get("kind") == "single":
            return SingleDeviceSharding(
                devices[data["device"]], memory_kind=data.get("memory_kind")
            )
        if data.get("kind") == "named":
            grid = np.array([devices[i] for i in data["devices"]], dtype=object)
            mesh = Mesh(grid.reshape(data["mesh_shape"]), tuple(data["axis_names"]))
            spec = PartitionSpec(*(tuple(p) if isinstance(p, list) else p for p in data["spec"]))  # type: ignore[no-untyped-call]
            return NamedSharding(mesh, spec, memory_kind=data.get("memory_kind"))
    except KeyError as exc:
        raise NamedNotFound(f"this host has no device {exc} that the executable runs on") from exc
    raise CorruptObject(f"unknown sharding {data.get('kind')!r} in a named executable")


def _as_array(value: Any, dtype: str) -> Any:
    import numpy as np

    if isinstance(value, (bool, int, float, complex)):
        return np.asarray(value, dtype=dtype)
    return value
