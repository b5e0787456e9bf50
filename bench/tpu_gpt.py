"""A 124M-parameter GPT on an accelerator: fresh-process start and step time, side by side.

The model (written here in plain JAX: GPT-2 small, 12 layers, d_model 768, 12 heads,
vocabulary 50304, sequence 512, batch 8, AdamW) has three jitted functions: `init`,
`train` (forward, backward, AdamW) and `eval`. Configurations, each in fresh processes
(interleaved, warm ones after an untimed prefill; JAX_PLATFORMS unset, so the TPU):
(a) no cache, (b) JAX's own persistent cache warm, (c) artifactstore's compile cache
warm (embedded store), with the working-set prefetch (the default: issue 31) and
without it (ARTSTORE_PREFETCH=0), (d) the three named executables loaded with
`artifactstore.load` one after another, and with `artifactstore.load_many` in parallel
(no model code traced). Per run: "setup" (the child's start to its first model line:
importing JAX, configuring the store, JAX's backend, the data: what a load ahead may
overlap), "first call" (first model line to
the first train step's loss on the host), the process wall, and where a warm start's
time goes (JAX's trace and lowering events; the store's fetch, decode and
deserialization), then the steady-state time of a train step (median of --steps).
Issue 31's targets: (c) first call <= 0.7x of (b); (d) <= 0.5x of (b); (d)'s step
<= 1.02x of (b)'s (jit). `--deserialize` also times deserializing the three stored
executables one after another against all at once in threads.

    python bench/tpu_gpt.py [--runs 3] [--steps 20] [--workdir DIR] [--deserialize]

A smoke run of the bench itself on a CPU (a tiny model):

    TPU_GPT_TINY=1 python bench/tpu_gpt.py --platform cpu --runs 1 --steps 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import _results
from warm_start import JAX_WARM, NO_CACHE, PLATFORM, Config, Result, config_records, run_child

STORE_WARM, NAMED = "artifactstore cache (warm)", "named executables (load)"
STORE_NO_PREFETCH = "artifactstore cache (warm, ARTSTORE_PREFETCH=0)"
NAMED_MANY = "named executables (load_many)"
NAMES = ("init", "train", "eval")
COLUMNS = [("setup (s)", "setup_secs"),
           ("first call (s)", "first_call_secs"), ("process wall (s)", "wall_secs"),
           ("trace+lower (s)", "trace_lower_secs"), ("XLA/load (s)", "compile_or_load_secs"),
           ("train step (ms)", "step_ms")]  # fmt: skip
RATIO_COLS = [("first/no-cache", "first_call_secs", NO_CACHE),
              ("first/jax-warm", "first_call_secs", JAX_WARM),
              ("wall/jax-warm", "wall_secs", JAX_WARM),
              ("step/jax-warm", "step_ms", JAX_WARM)]  # fmt: skip
TARGETS = {STORE_WARM: 0.7, NAMED: 0.5, NAMED_MANY: 0.5}
V, T, D, L, H, B = 50304, 512, 768, 12, 12, 8
if os.environ.get("TPU_GPT_TINY"):  # a smoke test of the bench itself, on a CPU
    V, T, D, L, H, B = 512, 32, 64, 2, 4, 2


# -- the model --------------------------------------------------------------------
def init(key: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    keys = iter(jax.random.split(key, 4 * L + 2))

    def dense(n_in: int, n_out: int) -> Any:
        return jax.random.normal(next(keys), (n_in, n_out), jnp.float32) * 0.02

    p = {"wte": dense(V, D), "wpe": dense(T, D), "lnf.g": jnp.ones(D), "lnf.b": jnp.zeros(D)}
    for i in range(L):
        p |= {f"h{i}.ln1.g": jnp.ones(D), f"h{i}.ln1.b": jnp.zeros(D),
              f"h{i}.qkv.w": dense(D, 3 * D), f"h{i}.qkv.b": jnp.zeros(3 * D),
              f"h{i}.proj.w": dense(D, D), f"h{i}.proj.b": jnp.zeros(D),
              f"h{i}.ln2.g": jnp.ones(D), f"h{i}.ln2.b": jnp.zeros(D),
              f"h{i}.fc.w": dense(D, 4 * D), f"h{i}.fc.b": jnp.zeros(4 * D),
              f"h{i}.out.w": dense(4 * D, D), f"h{i}.out.b": jnp.zeros(D)}  # fmt: skip
    zeros = {k: jnp.zeros_like(v) for k, v in p.items()}
    return p, {"m": zeros, "v": dict(zeros), "t": jnp.zeros((), jnp.int32)}


def loss_fn(p: dict[str, Any], x: Any, y: Any) -> Any:
    import jax
    import jax.numpy as jnp

    def mm(a: Any, w: Any) -> Any:
        return jnp.dot(a.astype(jnp.bfloat16), w.astype(jnp.bfloat16),
                       preferred_element_type=jnp.float32)  # fmt: skip

    def ln(a: Any, name: str) -> Any:
        mu = a.mean(-1, keepdims=True)
        var = ((a - mu) ** 2).mean(-1, keepdims=True)
        return (a - mu) * jax.lax.rsqrt(var + 1e-5) * p[f"{name}.g"] + p[f"{name}.b"]

    h = p["wte"][x] + p["wpe"][None, : x.shape[1]]
    mask = jnp.tril(jnp.ones((T, T), bool))
    for i in range(L):
        a = mm(ln(h, f"h{i}.ln1"), p[f"h{i}.qkv.w"]) + p[f"h{i}.qkv.b"]
        q, k, v = (t.reshape(B, T, H, D // H) for t in jnp.split(a, 3, axis=-1))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(D // H)
        att = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1)
        o = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(B, T, D)
        h = h + mm(o, p[f"h{i}.proj.w"]) + p[f"h{i}.proj.b"]
        f = jax.nn.gelu(mm(ln(h, f"h{i}.ln2"), p[f"h{i}.fc.w"]) + p[f"h{i}.fc.b"])
        h = h + mm(f, p[f"h{i}.out.w"]) + p[f"h{i}.out.b"]
    logits = mm(ln(h, "lnf"), p["wte"].T)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, y[..., None], axis=-1).mean()


def train(p: dict[str, Any], opt: dict[str, Any], x: Any, y: Any) -> tuple[Any, Any, Any]:
    import jax
    import jax.numpy as jnp

    loss, g = jax.value_and_grad(loss_fn)(p, x, y)
    t = opt["t"] + 1
    b1, b2, lr, wd = 0.9, 0.95, 3e-4, 0.1
    m = {k: b1 * opt["m"][k] + (1 - b1) * g[k] for k in p}
    v = {k: b2 * opt["v"][k] + (1 - b2) * g[k] ** 2 for k in p}
    c1, c2 = 1 - b1 ** t.astype(jnp.float32), 1 - b2 ** t.astype(jnp.float32)
    new = {k: p[k] - lr * (m[k] / c1 / (jnp.sqrt(v[k] / c2) + 1e-8) + wd * p[k]) for k in p}
    return new, {"m": m, "v": v, "t": t}, loss


def evaluate(p: dict[str, Any], x: Any, y: Any) -> Any:
    return loss_fn(p, x, y)


# -- the child process --------------------------------------------------------------
# Where a warm start's time goes: (module:object, method, phase) timed in the store's
# children. tests/test_bench_probes.py checks that each still exists (a redesign renamed
# the lookup's methods once, and the TPU run found out).
PROBES = (
    ("artifactstore.runtime.sources:TierSource", "peek", "fetch+decode"),
    ("artifactstore.runtime.sources:StoreSource", "peek", "fetch+decode"),
    ("artifactstore.formats.codec", "decode", "decode"),
    ("artifactstore.jaxhook.compile:_Compile", "load", "deserialize"),
    ("artifactstore.named.context:Context", "find", "named find"),
)


def probe_targets() -> list[tuple[Any, str, str]]:
    """PROBES resolved: (object, method name, phase)."""
    import importlib

    out = []
    for where, attr, phase in PROBES:
        module, _, name = where.partition(":")
        obj: Any = importlib.import_module(module)
        if name:
            obj = getattr(obj, name)
        out.append((obj, attr, phase))
    return out


def _timed(obj: Any, attr: str, into: dict[str, float], key: str) -> None:
    """Wrap obj.attr so that its wall time adds up in into[key] (the bench's probe)."""
    original = getattr(obj, attr)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into[key] = into.get(key, 0.0) + time.perf_counter() - started

    setattr(obj, attr, wrapper)


def child(a: argparse.Namespace) -> None:
    born = time.perf_counter()  # before JAX's import: "setup" is what a load ahead overlaps
    import jax

    imported = time.perf_counter()
    import numpy as np

    events: dict[str, float] = {}
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, secs, **kw: events.__setitem__(name, events.get(name, 0.0) + secs)
        if "artifactstore_named_call" not in str(kw.get("fun_name", "")) else None
    )  # fmt: skip
    phases: dict[str, float] = {}
    if a.jax_cache:
        jax.config.update("jax_compilation_cache_dir", a.jax_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if a.store or a.named:
        import artifactstore

        for obj, attr, phase in probe_targets():
            _timed(obj, attr, phases, phase)
        artifactstore.configure(url=a.store or a.named)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, size=(B, T + 1), dtype=np.int32)
    x, y = tokens[:, :-1], tokens[:, 1:]
    key_started = time.perf_counter()
    key = np.asarray(jax.random.PRNGKey(0))  # JAX's backend, and a first small jit
    key_secs = time.perf_counter() - key_started
    built = Path(a.named or ".", "built").exists()
    t0 = time.perf_counter()
    if a.named and built and os.environ.get("TPU_GPT_LOAD_MANY"):
        fns = artifactstore.load_many([(f"bench/gpt-{n}", "1") for n in NAMES])
        source = fns[1].source
    elif a.named and built:
        fns = [artifactstore.load(f"bench/gpt-{n}", version="1") for n in NAMES]
        source = fns[1].source
    elif a.named:  # the prefill: build and store the three
        spec = jax.ShapeDtypeStruct
        key_spec = spec(key.shape, key.dtype)
        p_spec, o_spec = jax.eval_shape(init, key_spec)
        batch = (spec(x.shape, x.dtype), spec(y.shape, y.dtype))
        args = {"init": (key_spec,), "train": (p_spec, o_spec, *batch), "eval": (p_spec, *batch)}
        fn = {"init": init, "train": train, "eval": evaluate}
        fns = [artifactstore.compiled(fn[n], *args[n], name=f"bench/gpt-{n}", version="1")
               for n in NAMES]  # fmt: skip
        source = fns[1].source
        Path(a.named, "built").touch()
    else:
        fns, source = [jax.jit(init), jax.jit(train), jax.jit(evaluate)], "jit"
    init_fn, train_fn, eval_fn = fns
    ready = time.perf_counter() - t0
    params, opt = init_fn(key)
    params, opt, loss = train_fn(params, opt, x, y)
    first_loss = float(loss)
    first_call = time.perf_counter() - t0
    eval_loss = float(eval_fn(params, x, y))
    all_three = time.perf_counter() - t0
    steps = []
    for _ in range(a.steps):
        started = time.perf_counter()
        params, opt, loss = train_fn(params, opt, x, y)
        loss.block_until_ready()
        steps.append(time.perf_counter() - started)
    ev = {k.rsplit("/", 1)[-1]: v for k, v in events.items()}
    print(json.dumps({
        "first_call_secs": first_call, "ready_secs": ready, "all_three_secs": all_three,
        "setup_secs": t0 - born, "key_secs": key_secs, "import_secs": imported - born,
        "loss": f"{first_loss:.6f}", "eval_loss": f"{eval_loss:.6f}", "source": source,
        "trace_lower_secs": ev.get("jaxpr_trace_duration", 0.0)
        + ev.get("jaxpr_to_mlir_module_duration", 0.0),
        "compile_or_load_secs": ev.get("backend_compile_duration", 0.0),
        "step_ms": 1000 * float(np.median(steps)) if steps else 0.0, "phases": phases,
        "fast": getattr(train_fn, "fast", None), "backend": jax.default_backend(),
        "prefetch": {k: v for k, v in stats().items() if k.startswith("prefetch")},
    }), flush=True)  # fmt: skip


def stats() -> dict[str, int]:
    """The store's counters of this process, where it uses one (prefetched, prefetch_used)."""
    if "artifactstore" not in sys.modules:
        return {}
    import artifactstore

    return artifactstore.process_stats()


def deserialize_test(store: str) -> dict[str, Any]:
    """The three largest stored executables: fetched and decoded, then deserialized one
    after another, then all at once in threads (does the backend overlap them?)."""
    import jax
    from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]

    from artifactstore import config
    from artifactstore.store import Store

    st = Store.open(config.resolve({"url": store}, {}))
    entries = sorted(st.parts.index.iter_entries(), key=lambda e: -e.size)[:3]
    backend = jax.devices()[0].client
    devices = xc.DeviceList(tuple(jax.devices()[:1]))
    started = time.perf_counter()
    payloads = [
        st.parts.reads.verify(e, st.parts.reads.fetch_object(e) or b"", e.fingerprint)
        for e in entries
    ]
    fetch_decode = time.perf_counter() - started

    def load(payload: bytes) -> Any:
        return backend.deserialize_executable(payload, devices, None)

    each = []
    for payload in payloads:
        started = time.perf_counter()
        load(payload)
        each.append(round(time.perf_counter() - started, 3))
    serial = sum(each)
    started = time.perf_counter()
    threads = [threading.Thread(target=load, args=(p,)) for p in payloads]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    parallel = time.perf_counter() - started
    return {"sizes_mb": [round(e.size / 2**20, 1) for e in entries],
            "raw_mb": [round(e.raw_size / 2**20, 1) for e in entries],
            "fetch_decode_secs": fetch_decode, "serial_secs": serial, "each_secs": each,
            "threads_secs": parallel, "threads_vs_serial": parallel / serial}  # fmt: skip


CONFIGS = [
    Config(NO_CACHE),
    Config(JAX_WARM, args=lambda tmp: ["--jax-cache", str(tmp / "jax")], prefill=True),
    Config(STORE_WARM, env=lambda tmp: {"ARTSTORE_MIN_COMPILE_SECS": "0"},
           args=lambda tmp: ["--store", str(tmp / "store")], prefill=True),
    Config(STORE_NO_PREFETCH,
           env=lambda tmp: {"ARTSTORE_MIN_COMPILE_SECS": "0", "ARTSTORE_PREFETCH": "0"},
           args=lambda tmp: ["--store", str(tmp / "store")], prefill=True),
    Config(NAMED, args=lambda tmp: ["--named", str(tmp / "named")], prefill=True),
    Config(NAMED_MANY, env=lambda tmp: {"TPU_GPT_LOAD_MANY": "1"},
           args=lambda tmp: ["--named", str(tmp / "named")], prefill=True),
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--configs", default="", help="substrings of config names (default all)")
    p.add_argument("--workdir", type=Path, help="keep each config's store here across calls")
    p.add_argument("--deserialize", action="store_true")
    p.add_argument("--platform", default="", help="JAX_PLATFORMS (default: JAX's choice)")
    p.add_argument("--out", type=Path)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--jax-cache", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--named", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(a)
        return 0
    PLATFORM[0] = a.platform
    wanted = [w for w in a.configs.lower().split(",") if w]
    configs = [c for c in CONFIGS if not wanted or any(w in c.name.lower() for w in wanted)]
    root = a.workdir or Path(__import__("tempfile").mkdtemp(prefix="tpu-gpt-"))
    tmps = {c.name: root / f"cfg{i}" for i, c in enumerate(CONFIGS)}
    raw: dict[str, list[Result]] = {c.name: [] for c in configs}

    def run(c: Config) -> Result:
        r = run_child(c, tmps[c.name], [sys.executable, __file__, "--child",
                                        "--steps", str(a.steps)])  # fmt: skip
        print(f"{c.name:<30} import {r['import_secs']:.2f}s key {r['key_secs']:.2f}s "
              f"setup {r['setup_secs']:.2f}s "
              f"first {r['first_call_secs']:7.2f}s wall {r['wall_secs']:7.2f}s "
              f"step {r['step_ms']:6.1f}ms {r['source']} {r['backend']} {r['phases']} "
              f"{r['prefetch']}",
              flush=True)  # fmt: skip
        return r

    for c in configs:  # prefills, unless a kept workdir holds them already
        tmps[c.name].mkdir(parents=True, exist_ok=True)
        if c.prefill and not (tmps[c.name] / "prefilled").exists():
            print(f"prefill (untimed): {c.name}", flush=True)
            run(c)
            (tmps[c.name] / "prefilled").touch()
    for _ in range(a.runs):
        for c in configs:
            raw[c.name].append(run(c))
    losses = {r["loss"] for rs in raw.values() for r in rs}
    report: dict[str, Any] = {**_results.run_info(), "runs": a.runs, "losses": sorted(losses)}
    keys = [k for _, k in COLUMNS]
    res = {c.name: {k: _results.summary([r[k] for r in raw[c.name]]) for k in keys}
           for c in configs if raw[c.name]}  # fmt: skip
    lines, _ = _results.table(res, COLUMNS, [r for r in RATIO_COLS if r[2] in res], [], JAX_WARM)
    for name, target in TARGETS.items():
        if name in res and JAX_WARM in res:
            got = (
                res[name]["first_call_secs"]["median"] / res[JAX_WARM]["first_call_secs"]["median"]
            )
            lines.append(f"target: {name} first call <= {target}x JAX warm: {got:.3f}x "
                         f"{'met' if got <= target else 'NOT met'}")  # fmt: skip
    if a.deserialize and STORE_WARM in tmps:
        report["deserialize"] = found = deserialize_test(str(tmps[STORE_WARM] / "store"))
        lines.append(f"deserialize 3 executables {found['sizes_mb']} MB: one after another "
                     f"{found['serial_secs']:.2f}s {found['each_secs']}, "
                     f"in threads {found['threads_secs']:.2f}s "
                     f"({found['threads_vs_serial']:.2f}x); "
                     f"fetch+decode {found['fetch_decode_secs']:.2f}s")  # fmt: skip
    if len(losses) > 1:
        lines.append(f"WARNING: first losses differ across configurations: {sorted(losses)}")
    text = "\n".join(lines) + f"\nmedian (min-max) over {a.runs} interleaved runs"
    print("\n" + text)
    report["configs"] = config_records(configs, res, raw) if res else []
    _results.write(a.out or _results.default_out("tpu_gpt"), report, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
