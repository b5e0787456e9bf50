"""The portable form lowered for the CPU, what cannot go native, and IREE's compile.

`jax.export` stores StableHLO for the platforms it was exported for; calling it from
a `jit` lowered for `cpu` gives one module whose `main` takes the named function's
array inputs flattened in pytree order and returns its outputs flattened as
`jax.export` orders them (the platform index and any shape assertions resolved).
Operations IREE cannot run as XLA does are refused before compiling, by name: custom
calls (host callbacks, LAPACK's kernels on the CPU, any target XLA resolves at run
time), and dtypes IREE changes on its way in (float64: demoted to float32; complex).
"""

from __future__ import annotations

import re
import time
from typing import Any

from artifactstore.errors import one_line
from artifactstore.named import container
from artifactstore.native import iree
from artifactstore.native.errors import NativeBuildError
from artifactstore.native.target import Cpu

SUPPORTED_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 bfloat16 float32".split()
)
_CUSTOM_CALL = re.compile(r'custom_call\s*@([\w.$-]+)|call_target_name\s*=\s*"([^"]+)"')
_UNSUPPORTED_TYPES = {r"[x<]f64\b": "float64", r"complex<": "complex", r"[x<]f8E\w+": "float8"}
_MODULE_NAME = re.compile(r"^module @[\w.$-]+ ", re.MULTILINE)
MODULE = "module"  # the IREE module's name: its entry function is `module.main`
_OPERATION = re.compile(r"operation '([\w.]+)'|'([\w.]+)' op")


def stablehlo(header: container.Header, body: bytes) -> str:
    """The portable form's StableHLO for the CPU, as one module's text."""
    import jax
    from jax import export as jax_export

    ref = f"{header.name}@{header.version}"
    exported = jax_export.deserialize(bytearray(body))
    if "cpu" not in exported.platforms:
        raise NativeBuildError(
            f"{ref} was exported for {', '.join(exported.platforms)} only; native modules "
            "are built from its cpu lowering: store a version with platforms=(..., 'cpu')"
        )
    args = header.inputs.unflatten(
        [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in header.inputs.leaves]  # type: ignore[no-untyped-call]
    )
    static = {i for i, _ in header.inputs.static_values()}
    dynamic = [a for i, a in enumerate(args) if i not in static]

    def call(*values: Any) -> Any:
        return exported.call(*values)  # type: ignore[no-untyped-call]

    traced = jax.jit(call, keep_unused=True).trace(*dynamic)
    try:
        lowered = traced.lower(lowering_platforms=("cpu",))
    except TypeError:  # a JAX without the keyword: this host's platform (cpu in CI)
        lowered = traced.lower()
    # One module name for every module (JAX names it after the function: `jit_call`), so
    # that a C program calls `module.main` whatever the function was.
    return _MODULE_NAME.sub(f"module @{MODULE} ", str(lowered.as_text()), count=1)


def refuse_unsupported(text: str, header: container.Header) -> None:
    """NativeBuildError naming the first operation or dtype that cannot go native."""
    ref = f"{header.name}@{header.version}"
    for what, leaves in (("input", header.inputs.leaves), ("output", header.outputs.leaves)):
        for i, leaf in enumerate(leaves):
            if leaf.dtype not in SUPPORTED_DTYPES:
                raise NativeBuildError(
                    f"{ref} cannot go native: {what} {i} is {leaf.describe()}; IREE's llvm-cpu "
                    f"takes {', '.join(sorted(SUPPORTED_DTYPES))}"
                )
    match = _CUSTOM_CALL.search(text)
    if match is not None:
        target = match.group(1) or match.group(2)
        raise NativeBuildError(
            f"{ref} cannot go native: it calls custom call {target!r} (a host callback or a "
            "kernel XLA links at run time, such as LAPACK's on the CPU), which IREE has not"
        )
    for pattern, dtype in _UNSUPPORTED_TYPES.items():
        if re.search(pattern, text):
            raise NativeBuildError(
                f"{ref} cannot go native: it computes in {dtype}, which IREE's llvm-cpu "
                "does not run as XLA does"
            )


def compile_module(text: str, target: str, cpu: Cpu) -> tuple[bytes, float]:
    """(the module's bytes, seconds) for `text` compiled by IREE for `target` and `cpu`;
    NativeBuildError naming the operation IREE refused."""
    compiler = iree.compiler()
    started = time.monotonic()
    try:
        vmfb = compiler.compile_str(
            text,
            target_backends=[target],
            input_type="stablehlo",
            extra_args=cpu.compiler_flags(),
        )
    except Exception as exc:
        message = str(exc)
        match = _OPERATION.search(message)
        op = f" (operation {match.group(1) or match.group(2)})" if match else ""
        first = next((ln for ln in message.splitlines() if "error" in ln), one_line(exc))
        raise NativeBuildError(f"IREE could not compile it{op}: {first.strip()[:300]}") from exc
    return bytes(vmfb), time.monotonic() - started
