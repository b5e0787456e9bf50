"""Host callbacks in a lowered module: can a stored executable be given this process's?

Part of the JAX adapter: it reads JAX's private MLIR module, so a JAX upgrade
may need to touch it too.

JAX before 0.11 never caches a program with host callbacks (jax.debug.print,
pure_callback, io_callback, equinox's runtime checks): they are Python functions
of this process. XLA's FFI callbacks refer to them only by position in host_callbacks
(`mhlo.backend_config = {index = N}`) and deserialize_executable takes the
current trace's list, so the executable can be stored and the callbacks bound
on load, provided the key says exactly what the executable expects of that list.
"""

from __future__ import annotations

import hashlib
from typing import Any

# Callback custom calls whose only link to Python is their index into host_callbacks.
FFI_CALLBACK_TARGETS = frozenset(
    {
        "xla_ffi_python_cpu_callback",
        "xla_ffi_python_gpu_callback",
        "xla_ffi_partitioned_python_cpu_callback",
        "xla_ffi_partitioned_python_gpu_callback",
        "xla_buffer_python_cpu_callback",
        "xla_buffer_python_gpu_callback",
        "xla_buffer_python_gpu_callback_cmd_buffer",
    }
)
# Custom calls that carry a process address in the module (legacy callbacks are
# called through it, not by index): programs holding them are never stored.
POINTER_TARGETS = frozenset(
    {"InspectSharding", "xla_python_cpu_callback", "xla_python_gpu_callback"}
)
PARTITIONING_TARGET = "CustomSPMDPartitioning"


class NotStorable(Exception):
    """This compile refers to Python objects that cannot be rebound on load."""


def callback_signature(computation: Any, count: int, drop_partitioning: bool) -> str:
    """What a stored executable expects of host_callbacks, to hash into its key:
    their number and, per callback custom_call in program order, its target, API
    version, side effect, index and operand/result types. jaxlib binds whatever
    list it is given (too few crash on execute), so any difference must be a miss.

    Raises NotStorable when the callbacks cannot be rebound by position: an
    address-carrying or unknown callback target, or indices that do not cover
    exactly the `count` host callbacks. `drop_partitioning`: JAX was told that
    custom partitioning pointers may be left out of keys.
    """
    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

    calls: list[str] = []
    indices: set[int] = set()
    refused: list[str] = []

    def visit(op: Any) -> Any:
        if op.name != "stablehlo.custom_call":
            return ir.WalkResult.ADVANCE
        attrs = op.attributes
        target = ir.StringAttr(attrs["call_target_name"]).value
        if target in FFI_CALLBACK_TARGETS:
            config = attrs["mhlo.backend_config"] if "mhlo.backend_config" in attrs else None
            opaque = "backend_config" in attrs and ir.StringAttr(attrs["backend_config"]).value
            if config is None or "index" not in config or opaque:
                refused.append(f"{target} without a callback index")
                return ir.WalkResult.ADVANCE
            index = ir.IntegerAttr(ir.DictAttr(config)["index"]).value
            indices.add(index)
            side = str(attrs["has_side_effect"]) if "has_side_effect" in attrs else "false"
            api = str(attrs["api_version"]) if "api_version" in attrs else "-"
            operands = ",".join(str(v.type) for v in op.operands)
            results = ",".join(str(r.type) for r in op.results)
            calls.append(f"{target}/{api}/{side}/{index}/({operands})->({results})")
        elif target == PARTITIONING_TARGET:
            if not drop_partitioning:  # its pointer would be in the key
                refused.append(target)
        elif target in POINTER_TARGETS or "callback" in target.lower():
            refused.append(target)
        return ir.WalkResult.ADVANCE

    computation.operation.walk(visit)
    if refused:
        raise NotStorable(f"custom call {refused[0]} cannot be rebound on load")
    if indices != set(range(count)):
        raise NotStorable(f"{count} host callbacks, module refers to {sorted(indices)[:8]}")
    text = f"{count}|" + ";".join(calls)
    return hashlib.sha256(text.encode()).hexdigest()
