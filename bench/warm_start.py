"""Warm start, side by side: fresh processes with no cache, JAX's own cache, and artifactstore.

Each configuration runs the bundled compile-heavy example in fresh subprocesses
(JAX_PLATFORMS=cpu unless --platform, no inherited ARTSTORE_* or JAX cache variables). Warm
configurations are pre-filled by one untimed run; timed runs are interleaved
round-robin so machine noise hits every configuration alike. All checksums
must agree. To add a configuration, append a `Config` to `CONFIGS`.

    python bench/warm_start.py [--runs 5] [--layers 10] [--out bench/results/warm_start.json]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import _results

EXAMPLE = [sys.executable, "-m", "artifactstore.examples.compile_heavy"]
STRIP_PREFIXES = ("ARTSTORE_", "JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE",
                  "JAX_ENABLE_COMPILATION_CACHE")  # fmt: skip
NO_CACHE, JAX_WARM = "no cache", "jax local cache (warm)"
TARGET_NAME, TARGET_RATIO = "artifactstore embedded (warm)", 1.05
S3PG_NAME, S3PG_RATIO = "artifactstore S3+PostgreSQL (warm)", 1.05  # issue 16 (was 1.10)
JAX_S3 = "jax cache on s3:// (warm)"
S3PG_NO_TIER = "artifactstore S3+PostgreSQL (new host, no local tier)"
DEFAULT_THRESHOLD = "artifactstore embedded (warm, default 0.1 s threshold)"
SIGNED = "artifactstore embedded (warm, signed, trusted keys set)"
TARGETS = [(TARGET_NAME, TARGET_RATIO), (S3PG_NAME, S3PG_RATIO)]  # wall <= ratio x JAX_WARM
# This bench's own: the team store must beat JAX's own cache on the same S3 server.
S3_TARGETS = [(S3PG_NAME, 1.0, JAX_S3),
              # issue 32: a pulled node with S3 and the index down starts as fast as with them up
              ("artstore pulled node (S3 and index down)", 1.05,
               "artstore pulled node (S3 and index up)")]  # fmt: skip
COLUMNS = [("first call (s)", "first_call_secs"), ("process wall (s)", "wall_secs")]
RATIO_COLS = [("first/no-cache", "first_call_secs", NO_CACHE),
              ("first/jax-warm", "first_call_secs", JAX_WARM),
              ("wall/jax-warm", "wall_secs", JAX_WARM)]  # fmt: skip
S3_RATIO_COLS = [
    ("wall/jax-s3", "wall_secs", JAX_S3),
    ("wall/pulled-up", "wall_secs", "artstore pulled node (S3 and index up)"),
]
summary, ratio = _results.summary, _results.ratio
INFRA = Path(__file__).resolve().parent.parent / "infra"
S3PG_BUCKET, S3PG_DATABASE = "artstore-bench-warm", "artstore_bench_warm"
PLATFORM = ["cpu"]  # JAX_PLATFORMS of the runs (--platform)


def no_env(_: Path) -> dict[str, str]:
    return {}


def no_args(_: Path) -> list[str]:
    return []


EnvFn = Callable[[Path], dict[str, str]]
Result = dict[str, Any]


@dataclass(frozen=True)
class Config:
    """One configuration; `env` and `args` get this config's private temp dir."""

    name: str
    args: Callable[[Path], list[str]] = no_args
    env: EnvFn = no_env
    prefill: bool = False  # one untimed run first, so timed runs start warm
    store: bool = False  # passes --store; warm timed runs must get store hits
    # Why this config cannot run here (a missing package), or None: then it is skipped
    # with that reason printed, and the other configs run.
    unavailable: Callable[[], str | None] | None = None
    # Run instead of the prefill (untimed): e.g. a writer elsewhere, then `artstore pull`.
    prepare: Callable[[Config, Path, Callable[[Config, Path], Result]], Result] | None = None


def embedded_env(tmp: Path) -> dict[str, str]:
    # Same threshold as the JAX-cache config (the example sets JAX's to 0 s).
    return {"ARTSTORE_URL": str(tmp), "ARTSTORE_MIN_COMPILE_SECS": "0"}


_s3pg_env: dict[str, str] | None = None


def _start_s3pg() -> dict[str, str]:
    """Moto S3 + a fresh PostgreSQL database, once per benchmark run; torn down at exit."""
    sys.path.insert(0, str(INFRA))
    import devstack  # infra/devstack.py

    server = devstack.start_moto()
    atexit.register(server.stop)
    devstack.create_bucket(server.endpoint, S3PG_BUCKET)
    url = devstack.create_database(S3PG_DATABASE)
    atexit.register(devstack.drop_database, S3PG_DATABASE)  # runs before server.stop
    env = {"ARTSTORE_URL": f"s3://{S3PG_BUCKET}/cache", "ARTSTORE_INDEX": url,
           "AWS_ENDPOINT_URL_S3": server.endpoint, **devstack.FAKE_CREDENTIALS}  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "artifactstore", "db", "upgrade"],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"[{S3PG_NAME}] db upgrade failed:\n{proc.stdout}{proc.stderr[-3000:]}")
    return env


def s3pg_env(tmp: Path) -> dict[str, str]:
    """A warm host: its local tier (private to this run) holds what the prefill loaded."""
    global _s3pg_env
    if _s3pg_env is None:
        _s3pg_env = _start_s3pg()
    env = {**_s3pg_env, "ARTSTORE_MIN_COMPILE_SECS": "0", "ARTSTORE_LOCAL_TIER": str(tmp)}
    return {**env, **team_keys(tmp)}


def team_keys(tmp: Path) -> dict[str, str]:
    """A team store requires signatures: the writer signs with the team's key and readers
    trust it (without one, a warm run loads nothing: untrusted_key, tier_unsigned)."""
    keys = signed_env(tmp.parent / "team")
    return {k: v for k, v in keys.items() if "KEY" in k}


def s3pg_no_tier_env(tmp: Path) -> dict[str, str]:
    """A host seeing the store for the first time: every load goes to the index and S3."""
    return {**s3pg_env(tmp), "ARTSTORE_LOCAL_TIER": "off"}


def jax_s3_env(tmp: Path) -> dict[str, str]:
    """JAX's cache on the team store's S3 server: etils epath -> fsspec -> s3fs, which
    takes the endpoint from AWS_ENDPOINT_URL_S3 (botocore's variable)."""
    if _s3pg_env is None:
        s3pg_env(tmp)
    assert _s3pg_env is not None
    return {k: v for k, v in _s3pg_env.items() if k.startswith("AWS_")}


def jax_s3_args(tmp: Path) -> list[str]:
    return ["--jax-cache", f"s3://{S3PG_BUCKET}/jax-cache/{tmp.name}"]


def jax_s3_objects(tmp: Path) -> int:
    """Objects JAX's cache holds under this config's prefix: none after a run means its
    cache never reached S3 (JAX only logs a failed write), so the row would be a compile."""
    import boto3

    env = jax_s3_env(tmp)
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"],
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                          region_name=env["AWS_DEFAULT_REGION"])  # fmt: skip
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=S3PG_BUCKET, Prefix=jax_s3_args(tmp)[1].split("/", 3)[3] + "/"
    )
    return sum(page.get("KeyCount", 0) for page in pages)


def jax_s3_missing() -> str | None:
    """JAX reads s3:// through `etils[epath]` and `s3fs`, which pins botocore: they live in
    a venv of their own (bench/README.md), so look before a run needs them."""
    probe = "import etils.epath, s3fs"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    if proc.returncode == 0:
        return None
    last = (proc.stderr.strip().splitlines() or ["?"])[-1]
    return (f"`{probe}` fails in {sys.executable} ({last}): install 'etils[epath]' "
            "and s3fs into a separate venv (see bench/README.md) and run from it")  # fmt: skip


def default_threshold_env(tmp: Path) -> dict[str, str]:
    """The store as users run it: compiles under 0.1 s are not stored (`--small-jits`)."""
    return {"ARTSTORE_URL": str(tmp)}


def signed_env(tmp: Path) -> dict[str, str]:
    """Issue 15: every entry signed on write and its signature verified on every load."""
    from artifactstore.config.keyfiles import generate

    keys = tmp.parent / f"{tmp.name}-keys"
    if tmp.is_absolute() and not (keys / "bench.key").exists():  # not the "<tmp>" in records
        keys.mkdir(exist_ok=True)
        generate("bench", keys)
    signing = {"ARTSTORE_SIGNING_KEY": str(keys / "bench.key")}
    return {**embedded_env(tmp), **signing, "ARTSTORE_TRUSTED_KEYS": str(keys / "bench.pub")}


PULLED_UP, PULLED_DOWN = S3_TARGETS[1][2], S3_TARGETS[1][0]


def pulled_env(tmp: Path) -> dict[str, str]:
    """Issue 32: a node `artstore pull` prepared, the store as users run it (quick jits under
    the default threshold are not stored), in a namespace of its own."""
    env = {**s3pg_env(tmp), "ARTSTORE_NAMESPACE": "bench-pulled", "ARTSTORE_LOCAL_TIER": str(tmp)}
    env.pop("ARTSTORE_MIN_COMPILE_SECS")
    return env


def pulled_down_env(tmp: Path) -> dict[str, str]:
    """The same node with the object store and the database unreachable."""
    return {**pulled_env(tmp), "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:1", "ARTSTORE_TIMEOUT": "2",
            "ARTSTORE_INDEX": "postgresql+psycopg://postgres@127.0.0.1:1/none"}  # fmt: skip


def pull_prepare(cfg: Config, tmp: Path, run: Callable[[Config, Path], Result]) -> Result:
    """A writer (its own tier) fills the namespace, then `artstore pull` (object store only)
    fills this node's tier."""
    writer_tier = tmp.parent / f"{tmp.name}-writer"
    writer_tier.mkdir(exist_ok=True)
    result = run(replace(cfg, env=pulled_env, prepare=None), writer_tier)
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIP_PREFIXES)}
    env.update({k: v for k, v in pulled_env(tmp).items() if k != "ARTSTORE_INDEX"})
    proc = subprocess.run([sys.executable, "-m", "artifactstore", "pull", "--json"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"[{cfg.name}] artstore pull failed:\n{proc.stderr[-3000:]}")
    said = json.loads(proc.stdout)
    print(
        f"  pulled: fetched {said.get('fetched')}, quick keys {said.get('quick_keys')}", flush=True
    )
    return result


CONFIGS: list[Config] = [
    Config(NO_CACHE),
    Config(JAX_WARM, args=lambda tmp: ["--jax-cache", str(tmp)], prefill=True),
    Config(JAX_S3, args=jax_s3_args, env=jax_s3_env, prefill=True, unavailable=jax_s3_missing),
    Config(TARGET_NAME, env=embedded_env, prefill=True, store=True),
    Config(DEFAULT_THRESHOLD, env=default_threshold_env, prefill=True, store=True),
    Config(SIGNED, env=signed_env, prefill=True, store=True),
    Config(S3PG_NAME, env=s3pg_env, prefill=True, store=True),
    Config(S3PG_NO_TIER, env=s3pg_no_tier_env, prefill=True, store=True),
    Config(PULLED_UP, env=pulled_env, prefill=True, store=True, prepare=pull_prepare),
    Config(PULLED_DOWN, env=pulled_down_env, prefill=True, store=True, prepare=pull_prepare),
]


def checkout(ref: str) -> Path:
    """`ref` of this repository in a temporary git worktree, removed at exit; or `ref`
    itself where it is a folder holding a tree (a machine without the repository's
    history: `git archive REF | tar -x -C DIR` made it)."""
    if Path(ref).is_dir():
        return Path(ref).resolve()
    repo = Path(__file__).resolve().parent.parent
    tree = Path(tempfile.mkdtemp(prefix="artstore-ab-")) / "tree"
    git = ["git", "-C", str(repo), "worktree"]
    subprocess.run([*git, "add", "--detach", "-q", str(tree), ref], check=True)
    atexit.register(subprocess.run, [*git, "remove", "--force", str(tree)], check=False)
    # Before 258a544 the example lived in examples/, mapped into the package at install:
    # put it where a process with the tree first on its path imports it from.
    if not (tree / "artifactstore" / "examples").exists() and (tree / "examples").is_dir():
        shutil.copytree(tree / "examples", tree / "artifactstore" / "examples")
    return tree


def with_before(configs: list[Config], ref: str) -> list[Config]:
    """A/B in one run: each config that uses the store twice, as this checkout and as
    `ref` (first on PYTHONPATH, so its processes import that artifactstore), adjacent in
    the round-robin so that both meet the same machine noise."""
    tree = checkout(ref)
    out = []
    for c in configs:
        out.append(c)
        if "ARTSTORE_URL" in c.env(Path("<tmp>")):

            def before_env(tmp: Path, env: EnvFn = c.env) -> dict[str, str]:  # c bound now
                # First on the path, before what the machine's own PYTHONPATH names (JAX,
                # where it is installed outside site-packages).
                inherited = os.environ.get("PYTHONPATH")
                path = os.pathsep.join([str(tree), *([inherited] if inherited else [])])
                return {**env(tmp), "PYTHONPATH": path}

            out.append(replace(c, name=f"{c.name} @{ref}", env=before_env))
    return out


def ab_lines(res: dict[str, dict[str, Any]], ref: str, metrics: list[str]) -> list[str]:
    """Each A/B pair's medians as ratios this checkout / `ref`: ~1.00x is within noise."""
    lines = []
    for name in res:
        if name.endswith(f" @{ref}"):
            now = name.removesuffix(f" @{ref}")
            got = [f"{k} {ratio(res[now][k]['median'], res[name][k]['median']):.3f}x"
                   for k in metrics]  # fmt: skip
            lines.append(f"A/B {now}: this checkout / {ref}: " + ", ".join(got))
    return lines


def run_once(cfg: Config, tmp: Path, layers: int, small_jits: int = 0) -> dict[str, Any]:
    out = run_child(cfg, tmp, [*EXAMPLE, "--layers", str(layers), "--small-jits", str(small_jits)])
    return {"wall_secs": out["wall_secs"], "first_call_secs": out["first_call_secs"],
            "setup_secs": out["setup_secs"], "checksum": out["checksum"],
            "store": out.get("store")}  # fmt: skip


def run_child(cfg: Config, tmp: Path, command: list[str]) -> dict[str, Any]:
    """Run `command` for `cfg` in a fresh process (no inherited store or JAX cache
    settings); its last stdout line as JSON, plus `wall_secs`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIP_PREFIXES)}
    env.update({"JAX_PLATFORMS": PLATFORM[0], **cfg.env(tmp)})
    cmd = [*command, *cfg.args(tmp), *(["--store"] if cfg.store else [])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"[{cfg.name}] run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_secs"] = wall
    return out


def interleaved(
    configs: list[Config],
    runs: int,
    run: Callable[[Config, Path], Result],
    on_run: Callable[[int, Config, Result], None],
) -> tuple[dict[str, list[Result]], list[Result]]:
    """Untimed prefills, then `runs` timed runs round-robin (run i of every config,
    then run i+1) so machine noise hits every configuration alike. Each config
    gets a private temp dir. Returns the timed results by config, and the prefills."""
    raw: dict[str, list[Result]] = {c.name: [] for c in configs}
    prefills: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="artstore-bench-") as root:
        tmps = {c.name: Path(root) / f"cfg{i}" for i, c in enumerate(configs)}
        for c in configs:
            tmps[c.name].mkdir()
            if c.prefill:
                print(f"prefill (untimed): {c.name} ...", flush=True)
                prepare = c.prepare or (lambda c, tmp, run: run(c, tmp))
                prefills.append(prepare(c, tmps[c.name], run))
        for i in range(runs):
            for c in configs:
                r = run(c, tmps[c.name])
                raw[c.name].append(r)
                on_run(i, c, r)
    return raw, prefills


def config_records(
    configs: list[Config], res: dict[str, dict[str, Any]], raw: dict[str, list[Result]]
) -> list[dict[str, Any]]:
    """Each config's settings (secrets masked), summaries and raw runs, for the JSON report."""
    return [{"name": c.name, "prefill": c.prefill, "store": c.store,
             "args": c.args(Path("<tmp>")),
             "env": {k: ("***" if "SECRET" in k else v) for k, v in c.env(Path("<tmp>")).items()},
             **res[c.name], "raw": raw[c.name]} for c in configs]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="timed runs per configuration")
    p.add_argument("--layers", type=int, default=10, help="example model depth")
    p.add_argument(
        "--small-jits", type=int, default=0, metavar="N",
        help="the example first runs N trivial jits, as ordinary programs do",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=_results.default_out("warm_start"))
    p.add_argument("--platform", default="cpu", help="JAX_PLATFORMS of the runs (cuda on a GPU)")
    p.add_argument("--configs", help="comma-separated substrings of config names to run "
                   f"(default all: {'; '.join(c.name for c in CONFIGS)})")  # fmt: skip
    p.add_argument("--before", metavar="REF", help="also run each store config as git REF "
                   "(A/B in one run: a refactoring must stay within noise)")  # fmt: skip
    a = p.parse_args(argv)
    PLATFORM[0] = a.platform
    wanted = [w.strip().lower() for w in a.configs.split(",")] if a.configs else None
    configs = [c for c in CONFIGS if not wanted or any(w in c.name.lower() for w in wanted)]
    if not configs:
        p.error(f"--configs {a.configs!r} matches no configuration")
    skipped: dict[str, str] = {}
    for c in configs:
        if c.unavailable is not None and (why := c.unavailable()) is not None:
            skipped[c.name] = why
            print(f"SKIPPED {c.name}: {why}", flush=True)
    configs = [c for c in configs if c.name not in skipped]
    if not configs:
        sys.exit("FAIL: every configuration asked for was skipped")
    if a.before:
        configs = with_before(configs, a.before)

    def on_run(i: int, c: Config, r: Result) -> None:
        print(f"run {i + 1}/{a.runs} {c.name:<54} first {r['first_call_secs']:7.3f}s"
              f"  wall {r['wall_secs']:7.3f}s", flush=True)  # fmt: skip
        st = r["store"] or {}
        if c.store and c.prefill and st.get("hits", 0) < 1:
            sys.exit(f"[{c.name}] warm run did not load from the store: {st}")

    def run(c: Config, tmp: Path) -> Result:
        r = run_once(c, tmp, a.layers, a.small_jits)
        if c.name == JAX_S3:
            r["s3_objects"] = jax_s3_objects(tmp)
            if not r["s3_objects"]:
                sys.exit(f"[{c.name}] JAX stored nothing on S3: its cache is not in use")
        return r

    raw, prefills = interleaved(configs, a.runs, run, on_run)
    checksums = {r["checksum"] for r in [*prefills, *(r for rs in raw.values() for r in rs)]}
    if len(checksums) != 1:
        sys.exit(f"FAIL: checksums differ across runs: {sorted(checksums)}")

    res: dict[str, dict[str, Any]] = {
        c.name: {k: summary([r[k] for r in raw[c.name]]) for k in ("first_call_secs", "wall_secs")}
        for c in configs
    }
    lines, targets = _results.table(
        res, COLUMNS, RATIO_COLS + S3_RATIO_COLS, [*TARGETS, *S3_TARGETS], JAX_WARM
    )
    n_runs = sum(map(len, raw.values())) + sum(c.prefill for c in configs)
    lines += [
        "",
        f"median (min-max) over {a.runs} interleaved runs; platform={a.platform}; "
        f"layers={a.layers}; "
        f"small jits={a.small_jits}; "
        f"identical checksum in all {n_runs} runs (prefills too): {next(iter(checksums))}",
        *_results.target_lines(targets, JAX_WARM),
        *(ab_lines(res, a.before, ["first_call_secs", "wall_secs"]) if a.before else []),
        *(f"SKIPPED {name}: {why}" for name, why in skipped.items()),
    ]
    text = "\n".join(lines)
    print("\n" + text)

    report = {
        **_results.run_info(),
        "runs": a.runs, "layers": a.layers, "small_jits": a.small_jits, "platform": a.platform,
        "before": a.before,
        "target": {k: v for k, v in targets[0].items() if k != "config"},  # embedded
        "targets": targets,
        "checksum": next(iter(checksums)),
        "configs": config_records(configs, res, raw),
        "skipped": skipped,
    }  # fmt: skip
    _results.write(a.out, report, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
