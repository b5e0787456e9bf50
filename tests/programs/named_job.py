"""Build or load the named executable `mlp@1` and call it, in a fresh process.

NAMED_MODE: `compiled` (artifactstore.compiled with the function) or `load` (by name
alone, with this directory removed from the path so the model cannot be imported).
NAMED_OTHER_FP=1: this host's fingerprint differs (another device kind), as on a
host of another type. NAMED_PLATFORMS: the platforms `compiled` exports the portable
form for (comma-separated). NAMED_WAIT_PREFETCH=1: configure the store and make the
backend first, then wait (bounded) until the working set was loaded ahead.
NAMED_MIN_CCV: the oldest jax.export calling convention this JAX pretends to read.
Prints one JSON line: how it was obtained, how often the function body ran, JAX's
trace/lower/compile events, a digest of the results, and the errors that wrong calls
raise.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
MODE = os.environ.get("NAMED_MODE", "compiled")
if MODE == "load":
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    assert importlib.util.find_spec("named_model") is None

import jax  # noqa: E402
import numpy as np  # noqa: E402

import artifactstore  # noqa: E402
from artifactstore.config import host  # noqa: E402

events: list[str] = []
stub_events: list[str] = []  # the fast call path's stub (artifactstore.named.call)


def _listen(name: str, _secs: float, **kw: Any) -> None:
    if name.startswith("/jax/core/compile/"):
        stub = "artifactstore_named_call" in str(kw.get("fun_name", ""))
        (stub_events if stub else events).append(name)


jax.monitoring.register_event_duration_secs_listener(_listen)
if os.environ.get("NAMED_MIN_CCV"):  # as if this JAX no longer read older exports
    jax.export.minimum_supported_calling_convention_version = int(os.environ["NAMED_MIN_CCV"])
if os.environ.get("NAMED_OTHER_FP"):
    host.register_provider(lambda f: {**f, "device_kind": "cpu-other-kind"})

if os.environ.get("NAMED_WAIT_PREFETCH"):  # the store, then the backend, then (bounded)
    artifactstore.configure()  # the working set loaded ahead: as a program that waits
    jax.devices()
    deadline = time.monotonic() + 60
    while not artifactstore.process_stats().get("prefetched") and time.monotonic() < deadline:
        time.sleep(0.01)

model: Any = None
try:
    if MODE == "load":
        fn = artifactstore.load("mlp", version="1")
    else:
        import named_model as model

        platforms = os.environ.get("NAMED_PLATFORMS")  # of the portable form: "cpu,tpu"
        fn = artifactstore.compiled(
            model.step, *model.SPECS, name="mlp", version="1", static_argnums=2,
            platforms=tuple(platforms.split(",")) if platforms else None,
        )  # fmt: skip
except artifactstore.ArtstoreError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    raise SystemExit(0) from None

fast = fn.fast  # waits for the fast call path (set up beside the program)
checked_calls = [0]
_checked = fn.call_checked


def _count_checked(*args: Any, **kwargs: Any) -> Any:
    checked_calls[0] += 1
    return _checked(*args, **kwargs)


fn.call_checked = _count_checked  # type: ignore[method-assign]
rng = np.random.default_rng(0)
params = {"w": rng.standard_normal((16, 16), dtype=np.float32) * 0.3,
          "b": rng.standard_normal(16, dtype=np.float32)}  # fmt: skip
x = rng.standard_normal((4, 16), dtype=np.float32)
out = fn(params, x, 3)
valid_checked = checked_calls[0]  # 0 where the fast path served the call
leaves = [out["out"], out["aux"][0], out["layers"][0]]
digest = hashlib.sha256(b"".join(np.asarray(a).tobytes() for a in leaves)).hexdigest()

errors = {}
wrong = {
    "shape": (params, x[:, :8], 3),
    "dtype": (params, x.astype(np.int32), 3),
    "structure": ({"w": params["w"]}, x, 3),
    "static": (params, x, 4),
    "count": (params, x),
}
for what, args in wrong.items():
    try:
        fn(*args)
    except artifactstore.NamedCallError as exc:
        errors[what] = str(exc)

print(json.dumps({
    "source": fn.source,
    "fast": fast,
    "checked_calls": [valid_checked, checked_calls[0]],
    "stub_events": sorted(set(stub_events)),
    "calls": model.CALLS[0] if model is not None else None,
    "model_imported": "named_model" in sys.modules,
    "events": sorted(set(events)),
    "event_count": len(events),
    "digest": digest,
    "aux_is_none": out["aux"][1] is None,
    "errors": errors,
    "stats": artifactstore.process_stats(),
}))  # fmt: skip
