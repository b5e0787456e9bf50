"""`artstore native`: named functions as native modules (IREE), built, checked, fetched.

`build` compiles a stored named executable's portable StableHLO for a target and CPU,
checks the module against XLA and stores it (exit 1, naming the outputs, where they
disagree); `get` writes a module this host may run and its calling convention into a
directory, for `iree-run-module` or a C/C++ program; `pull` fills this host's tier with
what `get` and `native.load` read here (a version's modules for the CPUs this host asks
for, and the portable form they are looked up by); `fingerprint` prints the digest that
`artstore pull --fingerprint` takes to fill a tier with all of a target's modules.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from artifactstore.cli.context import EXIT_FAIL, Ctx, fail
from artifactstore.cli.render import fetch_jobs_option, json_option, print_json
from artifactstore.formats.sizes import format_size

TARGET = click.option(
    "--target",
    default="llvm-cpu",
    show_default=True,
    help="IREE target backend (llvm-cpu: this architecture's CPUs).",
)

COMPILER = click.option(
    "--compiler",
    metavar="VERSION",
    help="IREE version that built the module [default: the installed runtime's].",
)


@click.group("native")
def native_group() -> None:
    """Named functions as native modules (IREE): no Python or JAX needed to run them."""


def _version(obj: Ctx, ref: str) -> tuple[str, str]:
    """NAME and VERSION of `ref` (NAME@VERSION, or NAME where the store holds one
    version's portable form)."""
    from artifactstore.index.repo import Filters
    from artifactstore.named import keys

    name, version = keys.parse_ref(ref)
    keys.check_name(name)
    if version is not None:
        return name, version
    with obj.index() as index:
        prefix = f"{keys.MODULE_PREFIX}{name}@"
        found = {
            keys.parse_module_name(e.module_name)
            for e in index.iter_entries(Filters(module_prefix=prefix))
            if e.fingerprint == keys.PORTABLE.digest
        }
    versions = sorted(v for parsed in found if parsed is not None for n, v in [parsed] if n == name)
    if len(versions) != 1:
        held = ", ".join(versions) if versions else "none"
        fail(f"{name}: name a version (NAME@VERSION); the store holds portable forms of: {held}")
    return name, versions[0]


@native_group.command("build")
@click.argument("ref", metavar="NAME[@VERSION]")
@TARGET
@click.option(
    "--cpu",
    default="generic",
    show_default=True,
    help="generic (any CPU of this architecture), host (this CPU exactly) or LLVM "
    "features (+avx2,+fma) this host has: the check runs the module here.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the check's inputs.")
@click.option(
    "--inputs",
    "inputs_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Check on these arrays instead (an .npz, arrays in the module's input order: "
    "real data, where generated inputs make a chaotic function disagree by rounding).",
)
@json_option("Print what was built and the check, as JSON.")
@click.pass_obj
def build_cmd(
    obj: Ctx,
    ref: str,
    target: str,
    cpu: str,
    seed: int,
    inputs_file: Path | None,
    as_json: bool,
) -> None:
    """Compile NAME@VERSION's portable form into a native module, check it against XLA
    on generated inputs, and store it. Exit 1 where it cannot go native or disagrees."""
    from artifactstore.jaxhook import api
    from artifactstore.native.builder import build

    name, version = _version(obj, ref)
    api.configure(**{k: v for k, v in obj.overrides.items() if v is not None})
    inputs: int | list[Any] = seed
    if inputs_file is not None:
        import numpy as np

        with np.load(inputs_file, allow_pickle=False) as arrays:
            inputs = [arrays[k] for k in arrays.files]
    built = build(name, version, target=target, cpu=cpu, inputs=inputs)
    c = built.convention
    if as_json:
        print_json({"key": built.key, "size": built.size, "present": built.present, **c.to_json()})
        return
    worst = max((r.get("max_diff") or 0.0 for r in built.rows), default=0.0)
    what = (
        "already stored"
        if built.present
        else f"built in {built.compile_secs:.1f} s, checked {len(built.rows)} outputs against "
        f"XLA (max |diff| {worst:.2g})"
    )
    click.echo(
        f"{name}@{version} for {target} (cpu {c.cpu}, IREE {c.compiler}): {what}; "
        f"key {built.key[:12]}, {format_size(built.size)}"
    )


@native_group.command("get")
@click.argument("ref", metavar="NAME[@VERSION]")
@TARGET
@click.option(
    "--cpu",
    help="The module built for this CPU (generic, host, features) [default: this host's "
    "exact CPU, else generic]; only one this host has.",
)
@COMPILER
@click.option(
    "-o",
    "--output",
    "out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write NAME.vmfb and NAME.json (the calling convention) into.",
)
@click.pass_obj
def get_cmd(
    obj: Ctx, ref: str, target: str, cpu: str | None, compiler: str | None, out: Path
) -> None:
    """Write NAME@VERSION's native module for this host, and its calling convention."""
    from artifactstore.native import fetch, iree
    from artifactstore.native.target import candidates, check_target

    name, version = _version(obj, ref)
    wanted = fetch.Wanted(name, version, check_target(target), compiler or iree.runtime_version())
    where = fetch.session(obj.settings())
    convention, module, chosen = fetch.find(where, wanted, candidates(cpu))
    out.mkdir(parents=True, exist_ok=True)
    stem = name.replace("/", "_")
    (out / f"{stem}.vmfb").write_bytes(module)
    described: dict[str, Any] = convention.describe_json()
    (out / f"{stem}.json").write_text(json.dumps(described, indent=2) + "\n")
    click.echo(
        f"{name}@{version} (cpu {chosen.describe()}, IREE {convention.compiler}): "
        f"{out / stem}.vmfb ({format_size(len(module))}) and {stem}.json"
    )


@native_group.command("pull")
@click.argument("ref", metavar="NAME[@VERSION]")
@TARGET
@click.option(
    "--cpu",
    help="Modules built for this CPU (generic, host, features) [default: what `get` asks "
    "for here: this host's exact CPU, then generic].",
)
@COMPILER
@fetch_jobs_option()
@json_option("Print one pull's summary per fingerprint, as JSON.")
@click.pass_obj
def pull_cmd(
    obj: Ctx,
    ref: str,
    target: str,
    cpu: str | None,
    compiler: str | None,
    jobs: int,
    as_json: bool,
) -> None:
    """Fill this host's local tier with NAME's (or NAME@VERSION's) native modules for the
    CPUs this host asks for, and with the portable forms they are looked up by: `get`
    and `native.load` then read them from the tier, without the object store or the
    index. `artstore pull` once per fingerprint, each limited to NAME's entries (the
    object store only: read-only credentials suffice). Exits 1 if a pull failed or the
    namespace holds no module of NAME for these CPUs."""
    from artifactstore.bundles import pull as _pull
    from artifactstore.cli.pull_cmd import summary
    from artifactstore.named import keys
    from artifactstore.native import iree
    from artifactstore.native.target import candidates, check_target

    name, version = keys.parse_ref(ref)
    keys.check_name(name)
    module = keys.module_name(name, version) if version else f"{keys.MODULE_PREFIX}{name}@*"
    target = check_target(target)
    compiler = compiler or iree.runtime_version()
    cpus = candidates(cpu)
    if not cpus:
        fail(f"this host cannot run modules built for CPU {cpu}: nothing to pull")
    puller = _pull.open_puller(obj.settings(need_index=False))
    asked = [("portable form", keys.PORTABLE.digest)] + [
        (f"cpu {c.describe()}", c.fingerprint(target, compiler).digest) for c in cpus
    ]
    reports = [
        (what, _pull.pull(puller, digest, module=module, jobs=jobs)) for what, digest in asked
    ]
    if as_json:
        print_json([{"pulled": what, **report.to_json()} for what, report in reports])
    else:
        for what, report in reports:
            click.echo(f"{what}: {summary(report)}")
    for _, report in reports:
        if report.never_held:
            fail(report.never_held)
    if not all(report.ok for _, report in reports):
        sys.exit(EXIT_FAIL)
    if not any(report.fetched + report.present for _, report in reports[1:]):
        held = ", ".join(c.describe() for c in cpus)
        fail(
            f"no native module of {ref} for {target} (CPU: {held}; IREE {compiler}) in "
            f"namespace {reports[0][1].namespace}: build one with `artstore native build`"
        )


@native_group.command("fingerprint")
@TARGET
@click.option("--cpu", default="generic", show_default=True, help="generic, host or features.")
@COMPILER
def fingerprint_cmd(target: str, cpu: str, compiler: str | None) -> None:
    """The fingerprint digest of modules for TARGET and CPU (for `artstore pull
    --fingerprint`, which fills this host's tier with them)."""
    from artifactstore.native import iree
    from artifactstore.native.target import check_target, parse_cpu

    version = compiler or iree.runtime_version()
    click.echo(parse_cpu(cpu).fingerprint(check_target(target), version).digest)
