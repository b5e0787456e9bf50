"""A worker process of `artstore warm MODULE:FUNCTION`: lower and compile, never run.

Started by `warm.specs` as `python -m artifactstore.warm.worker TARGET` (a
fresh interpreter: JAX never forks). It imports MODULE, calls FUNCTION,
validates what it returned, and announces the specializations' names. Then it
reads item indices on stdin and answers one JSON line per item on the
protocol stream (the original stdout; the program's own prints and C-level
output go to stderr). Each item is `fn.lower(*args, **kwargs).compile()` with
the store in write mode: a stored entry loads instead of compiling.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import IO, Any

from artifactstore import interrupts
from artifactstore.errors import ArtstoreError, one_line
from artifactstore.jaxhook import api as _ji
from artifactstore.named.spec import NamedSpec
from artifactstore.warm import NOT_STORED, TARGET_RE, child

_SHORT_DTYPES = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "bfloat16": "bf16",
    "int8": "s8",
    "int16": "s16",
    "int32": "s32",
    "int64": "s64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "bool": "pred",
    "complex64": "c64",
    "complex128": "c128",
}
_NAME_MAX = 100


class SpecError(ArtstoreError):
    """MODULE:FUNCTION is missing, or returned something that is not a list of specializations."""


@dataclass
class Item:
    name: str
    fn: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    named: NamedSpec | None = None


# -- loading and validating MODULE:FUNCTION ---------------------------------
def load_items(target: str) -> tuple[list[Item], int]:
    """The distinct specializations FUNCTION lists, and how many duplicates were dropped."""
    if not TARGET_RE.fullmatch(target):
        raise SpecError(
            f"invalid target {target!r}: use MODULE:FUNCTION, e.g. mypkg.shapes:specializations"
        )
    module_name, _, attr = target.partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules beside the caller
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise SpecError(
                f"no module named {module_name!r} (run from the directory that "
                "holds it, or install it)"
            ) from None
        raise SpecError(f"importing {module_name!r} failed: {one_line(exc)}") from None
    except Exception as exc:
        raise SpecError(f"importing {module_name!r} failed: {one_line(exc)}") from None
    func: Any = module
    for part in attr.split("."):
        if not hasattr(func, part):
            raise SpecError(f"module {module_name!r} has no attribute {attr!r}")
        func = getattr(func, part)
    if not callable(func):
        raise SpecError(
            f"{target} is {type(func).__name__}, not a function returning "
            "(jitted function, argument specs) pairs"
        )
    try:
        result = func()
    except Exception as exc:
        raise SpecError(f"{target}() raised {one_line(exc)}") from None
    return _validate(target, result)


def _validate(target: str, result: Any) -> tuple[list[Item], int]:
    pairs: Iterable[tuple[str | None, Any]]
    if isinstance(result, Mapping):
        pairs = ((str(k), v) for k, v in result.items())
    elif isinstance(result, (str, bytes)) or not isinstance(result, Iterable):
        raise SpecError(
            f"{target}() returned {type(result).__name__}: expected an iterable of "
            "(jitted function, argument specs) or a dict name -> "
            "(jitted function, argument specs)"
        )
    else:
        pairs = ((None, v) for v in result)
    items: list[Item] = []
    seen: set[Any] = set()
    duplicates = 0
    try:
        for n, (name, raw) in enumerate(pairs):
            item = _item(target, n, name, raw)
            key = _dedupe_key(item)
            if key is not None and key in seen:
                duplicates += 1
                continue
            if key is not None:
                seen.add(key)
            items.append(item)
    except SpecError:
        raise
    except Exception as exc:
        raise SpecError(
            f"iterating over what {target}() returned failed: {one_line(exc)}"
        ) from None
    if not items:
        raise SpecError(f"{target}() returned no specializations")
    _unique_names(items)
    return items, duplicates


def _item(target: str, n: int, name: str | None, raw: Any) -> Item:
    if isinstance(raw, NamedSpec):  # a named executable: built, stored under its name
        return Item(raw.ref, raw.fn, tuple(raw.specs), {}, named=raw)
    where = f"{target}() item {n}" + (f" ({name!r})" if name else "")
    if not isinstance(raw, (tuple, list)):
        raise SpecError(
            f"{where} is {type(raw).__name__}: expected (jitted function, args) or "
            "(name, jitted function, args[, kwargs])"
        )
    parts = list(raw)
    if parts and isinstance(parts[0], str):
        name = parts.pop(0)
        where = f"{target}() item {n} ({name!r})"
    if len(parts) not in (2, 3):
        raise SpecError(
            f"{where} has {len(raw)} elements: expected (jitted function, args), "
            "(jitted function, args, kwargs) or (name, jitted function, args)"
        )
    fn, args = parts[0], parts[1]
    kwargs = parts[2] if len(parts) == 3 else {}
    if not callable(getattr(fn, "lower", None)):
        raise SpecError(
            f"{where}: {type(fn).__name__} is not a jitted function (wrap it with jax.jit)"
        )
    if _is_spec_leaf(args):
        args = (args,)
    if not isinstance(args, (tuple, list)):
        raise SpecError(
            f"{where}: argument specs must be a tuple of positional arguments "
            f"(pytrees of jax.ShapeDtypeStruct or arrays), got {type(args).__name__}"
        )
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise SpecError(f"{where}: keyword argument specs must be a dict with string keys")
    item = Item(name or "", fn, tuple(args), dict(kwargs))
    if not item.name:
        item.name = _spec_name(item)
    return item


def _is_spec_leaf(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _describe_leaf(x: Any) -> str:
    if _is_spec_leaf(x):
        dtype = str(getattr(x.dtype, "name", x.dtype))
        return f"{_SHORT_DTYPES.get(dtype, dtype)}[{','.join(str(d) for d in x.shape)}]"
    return repr(x)[:20]


def _spec_name(item: Item) -> str:
    """`predict(f32[8,128], s32[8])`: the function and the shapes it is compiled for."""
    import jax

    fn_name = getattr(item.fn, "__name__", None) or type(item.fn).__name__
    parts = []
    for arg in (*item.args, *item.kwargs.values()):
        leaves = jax.tree_util.tree_leaves(arg)
        if len(leaves) == 1 and leaves[0] is arg:
            parts.append(_describe_leaf(arg))
        elif len(leaves) <= 3:
            parts.append("(" + ", ".join(_describe_leaf(x) for x in leaves) + ")")
        else:
            parts.append(f"<{len(leaves)} arrays>")
    text = f"{fn_name}({', '.join(parts)})"
    return text if len(text) <= _NAME_MAX else text[: _NAME_MAX - 3] + "..."


def _dedupe_key(item: Item) -> Any:
    """Same function and same abstract arguments: one compile, listed twice."""
    import jax

    if item.named is not None:
        return ("named", item.named.ref)
    try:
        leaves, tree = jax.tree_util.tree_flatten((item.args, item.kwargs))
        sig = tuple(
            (tuple(x.shape), str(x.dtype), str(getattr(x, "sharding", None)))
            if _is_spec_leaf(x)
            else ("static", repr(x))
            for x in leaves
        )
        key = (id(item.fn), str(tree), sig)
        hash(key)
        return key
    except Exception:
        return None


def _unique_names(items: list[Item]) -> None:
    counts: dict[str, int] = {}
    for item in items:
        counts[item.name] = counts.get(item.name, 0) + 1
        if counts[item.name] > 1:
            item.name = f"{item.name} #{counts[item.name]}"


# -- one specialization -----------------------------------------------------
class Warnings(logging.Handler):
    """Keeps artifactstore's warnings, so a failure can say why instead of "see the log"."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().removeprefix("artifactstore: "))

    def since(self, mark: int, fallback: str) -> str:
        new = self.messages[mark:]
        return new[-1] if new else fallback


def warm_one(item: Item, recorder: child.Recorder, warnings: Warnings) -> dict[str, Any]:
    """Lower and compile `item` through the store; what happened, as a JSON-able dict."""
    result: dict[str, Any] = {
        "name": item.name,
        "status": "failed",
        "error": "",
        "compile_secs": 0.0,
        "bytes": 0,
    }
    started = time.monotonic()
    mark, warned = recorder.mark(), len(warnings.messages)
    before = _ji.process_stats()
    failed = _compile(item)
    if failed is not None:
        result["error"] = failed
        return result
    flushed = _ji.flush(child.flush_secs())
    after = _ji.process_stats()
    result["secs"] = time.monotonic() - started
    compiles = after.get("compiles", 0) - before.get("compiles", 0)
    loads = after.get("loads", 0) - before.get("loads", 0)
    result["xla_compiles"] = compiles
    events = recorder.since(mark)
    if not events and loads and not compiles:  # served by a source in front of the store
        events = [{"kind": "present", "key": item.name, "module": item.name}]
    result["events"] = events  # what the parent's report counts (Report.add_event)
    result.update(_outcome(events, compiles))
    if result["status"] == "failed" and not result["error"]:
        if not flushed:
            result["error"] = "compiled, but the upload did not finish within the flush bound"
        else:
            why = "the store did not handle this compile (PGLE, or a program it cannot hold)"
            result["error"] = "compiled, but not stored: " + warnings.since(warned, why)
    return result


def _compile(item: Item) -> str | None:
    """Build `item` (a named executable) or lower and compile it (a function); why it
    failed, or None."""
    if item.named is not None:
        from artifactstore.named.api import compiled

        spec = item.named
        try:
            compiled(
                spec.fn,
                *spec.specs,
                name=spec.name,
                version=spec.version,
                static_argnums=spec.static_argnums,
                platforms=spec.platforms,
            )
        except Exception as exc:
            return f"does not build: {one_line(exc)}"
        return None
    try:
        lowered = item.fn.lower(*item.args, **item.kwargs)
    except Exception as exc:
        return f"does not lower: {one_line(exc)}"
    try:
        lowered.compile()
    except Exception as exc:
        return f"does not compile: {one_line(exc)}"
    return None


def _outcome(events: list[dict[str, Any]], compiles: int) -> dict[str, Any]:
    """What the store's events for one item say of it: not stored (and why), compiled
    and stored (here or by another process), or present; nothing where none says."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        kinds.setdefault(event["kind"], []).append(event)
    added, present = kinds.get("added", []), kinds.get("present", [])
    stored = added + kinds.get("concurrent", [])
    if kinds.get("not_stored"):
        first = kinds["not_stored"][0]
        why = NOT_STORED.get(first["why"], first["why"])
        detail = f" ({first['error']})" if first.get("error") else ""
        return {"error": f"compiled, but not stored: {why}{detail}", "why": first["why"]}
    if stored:
        outcome = {
            "status": "compiled",
            "compile_secs": sum(a["compile_secs"] for a in stored),
            "bytes": sum(a["bytes"] for a in stored),
            "fingerprint": stored[0]["fingerprint"],
        }
        return outcome if added else {**outcome, "stored_by": "another process"}
    if present:
        return {
            "status": "present",
            "compile_secs": sum(p.get("compile_secs", 0.0) for p in present),
            "fingerprint": present[0].get("fingerprint"),
            "compiled": compiles > 0,
        }
    return {}


# -- the process ------------------------------------------------------------
def _send(stream: IO[str], message: dict[str, Any]) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def main(argv: list[str]) -> int:
    # The protocol gets the real stdout; everything else printed goes to stderr.
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    if len(argv) != 1:
        _send(proto, {"fatal": "usage: python -m artifactstore.warm.worker MODULE:FUNCTION"})
        return 2
    warnings = Warnings()
    log = logging.getLogger("artifactstore")
    log.addHandler(warnings)
    log.addHandler(logging.StreamHandler(sys.stderr))
    try:
        recorder = child.configure_for_warming()
    except ArtstoreError as exc:
        _send(proto, {"fatal": str(exc)})
        return 1
    if recorder is None:
        _send(proto, {"fatal": "in the worker: " + warnings.since(0, "the store is unavailable")})
        return 1
    try:
        items, duplicates = load_items(argv[0])
        fingerprint = _ji.host_fingerprint()
    except ArtstoreError as exc:
        _send(proto, {"fatal": str(exc), "usage": isinstance(exc, SpecError)})
        return 2
    except Exception as exc:
        _send(proto, {"fatal": f"cannot open the JAX backend: {one_line(exc)}"})
        return 1
    _send(
        proto,
        {
            "ready": [i.name for i in items],
            "duplicates": duplicates,
            "fingerprint": {**fingerprint.to_dict(), "digest": fingerprint.digest},
        },
    )
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            index = int(line)
            out = warm_one(items[index], recorder, warnings)
            _send(proto, {"index": index, **out})
    except BaseException:  # stopped (SIGTERM, Ctrl-C) mid-compile: leases go at exit
        store = _ji.active_store()
        if store is not None and store.flight is not None:
            store.flight.release_all()
        raise
    return 0


def _stop(signum: int, frame: FrameType | None) -> None:
    """The first SIGTERM or SIGINT (the parent stops its pool; Ctrl-C reaches the whole
    process group) unwinds the compile, so that its lease is let go at exit; later
    ones must not cut that short."""
    for other in interrupts.SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    interrupts.deliver(signum)


def run(argv: list[str]) -> int:
    for signum in interrupts.SIGNALS:
        signal.signal(signum, _stop)
    try:
        return main(argv)
    except KeyboardInterrupt:
        return interrupts.EXIT_CODES[signal.SIGINT]
    except interrupts.Terminated:
        return interrupts.EXIT_CODES[signal.SIGTERM]


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
