"""`artstore warm`: pre-warming the store from a CI job, checked by fresh reader processes."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import PROGRAMS, artstore, artstore_warm, clean_env, run_program

from artifactstore import config
from artifactstore.runtime.run import STARTUP_DIR as ACTIVATE_DIR
from artifactstore.warm import ENV_VAR

SCRIPT = str(PROGRAMS / "warm_script.py")


def reader(env: dict[str, str], **extra: str) -> dict[str, str]:
    """A worker's environment: the same store, read-only."""
    return {**env, "ARTSTORE_READ_ONLY": "1", **extra}


def _all_compiles(out: dict[str, Any]) -> list[str]:
    child = out.get("child") or {}
    return list(out["xla_compiles"]) + list(child.get("xla_compiles", []))


# -- warm -- CMD ----------------------------------------------------------------
def test_warm_command_then_fresh_process_loads_everything(
    store_env: dict[str, str], tmp_path: Path
) -> None:
    code, report, output = artstore_warm(
        "--", sys.executable, SCRIPT, "--child", env=store_env, tmp_path=tmp_path
    )
    assert code == 0, output
    assert report["exit_code"] == 0 and report["processes"] == 2  # the script and its child
    assert report["problems"] == []
    # The hook made both processes store what they compiled; a process may load
    # what the other stored first, so count both.
    warmed = json.loads(output.splitlines()[0])
    assert warmed["store"]["active"] == 1 and warmed["child"]["store"]["active"] == 1
    stored_or_loaded = report["added"] + report["present"] + report["concurrent"]
    assert stored_or_loaded == len(_all_compiles(warmed)) + sum(
        o["store"].get("loads", 0) for o in (warmed, warmed["child"])
    )
    assert report["added"] >= len(warmed["xla_compiles"])
    assert report["bytes_uploaded"] > 0 and report["compile_secs_added"] > 0
    [fp] = report["fingerprints"]
    assert fp["platform"] == "cpu" and fp["digest"][:12] in output
    assert "entries added" in output and "compile time saved" in output

    fresh = run_program("warm_script.py", reader(store_env, WARM_SCRIPT_STORE="1"))
    assert _all_compiles(fresh) == []  # 100% hits, in the child process too
    assert fresh["store"]["hits"] == len(warmed["xla_compiles"])
    assert fresh["results"] == warmed["results"]
    stats = json.loads(artstore("stats", "--json", env=store_env).stdout)
    assert stats["entries"] == report["added"]


def test_warm_command_propagates_the_exit_code(store_env: dict[str, str], tmp_path: Path) -> None:
    code, report, output = artstore_warm(
        "--", sys.executable, SCRIPT, "--exit", "3", env=store_env, tmp_path=tmp_path
    )
    assert code == 3, output
    assert report["exit_code"] == 3
    assert report["added"] > 0  # what it compiled before failing is stored all the same

    crash = tmp_path / "crash.py"
    crash.write_text("import jax.numpy as jnp\njnp.ones(3).sum()\nraise SystemExit('boom')\n")
    code, report, output = artstore_warm(
        "--", sys.executable, str(crash), env=store_env, tmp_path=tmp_path
    )
    assert code == 1 and report["exit_code"] == 1
    assert "boom" in output


def test_warm_command_on_a_team_store(team_env: dict[str, str], tmp_path: Path) -> None:
    # The script configures artifactstore itself, as the README suggests: still warmed,
    # still counted.
    env = {**team_env, "WARM_SCRIPT_STORE": "1"}
    code, report, output = artstore_warm("--", sys.executable, SCRIPT, env=env, tmp_path=tmp_path)
    assert code == 0, output
    warmed = json.loads(output.splitlines()[0])
    assert report["problems"] == [] and report["added"] == len(warmed["xla_compiles"]) > 0
    assert "testing-secret" not in output and "testing-secret" not in json.dumps(report)

    fresh = run_program("warm_script.py", reader(team_env, WARM_SCRIPT_STORE="1"))
    assert fresh["xla_compiles"] == []
    assert fresh["store"]["hits"] == report["added"] + report["present"]
    assert (
        json.loads(artstore("stats", "--json", env=team_env).stdout)["entries"] == (report["added"])
    )


POOL = """
import multiprocessing as mp

def work(n):
    import jax.numpy as jnp
    return float((jnp.arange(float(n)) * 3).sum())

if __name__ == "__main__":
    with mp.get_context("spawn").Pool(2) as pool:  # terminate()s its workers on exit
        print(pool.map(work, [4, 5]))
"""


def test_warm_command_counts_multiprocessing_workers_that_are_terminated(
    store_env: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "pool.py"
    script.write_text(POOL)
    code, report, output = artstore_warm(
        "--", sys.executable, str(script), env=store_env, tmp_path=tmp_path
    )
    assert code == 0, output
    assert output.startswith("[18.0, 30.0]\n")
    assert report["processes"] == 2 and report["added"] > 0 and report["problems"] == []
    assert "were ended before a normal exit" in report["notes"][0]
    stats = json.loads(artstore("stats", "--json", env=store_env).stdout)
    assert stats["entries"] == report["added"]  # stored before the pool ended them


def test_warm_command_that_warms_nothing_fails(store_env: dict[str, str], tmp_path: Path) -> None:
    code, report, output = artstore_warm(
        "--", sys.executable, "-c", "print('no jax here')", env=store_env, tmp_path=tmp_path
    )
    assert code == 1
    assert report["processes"] == 0 and "nothing was warmed" in output
    code, _, output = artstore_warm("--", "no-such-command-xyz", env=store_env, tmp_path=tmp_path)
    assert code == 1
    assert output.strip() == "artstore: error: command not found: 'no-such-command-xyz'"


# -- the activation hook ----------------------------------------------------------
PROBE = """
import json, sys
import jax
from jax._src import compiler
print(json.dumps({
    "artifactstore": sorted(m for m in sys.modules if m.startswith("artifactstore.")),
    "wrapped": compiler.compile_or_get_cached.__module__ != "jax._src.compiler",
    "chained": "other_sitecustomize_ran" in sys.modules,
    "meta_path": [type(f).__name__ for f in sys.meta_path],
}))
"""


def _probe(tmp_path: Path, code: str, **extra: str) -> dict[str, Any]:
    other = tmp_path / "other"  # a sitecustomize further down the path (Debian, conda)
    other.mkdir(exist_ok=True)
    (other / "sitecustomize.py").write_text(
        "import sys, types\nsys.modules['other_sitecustomize_ran'] = types.ModuleType('x')\n"
    )
    env = clean_env(PYTHONPATH=f"{ACTIVATE_DIR}:{other}", ARTSTORE_URL=str(tmp_path / "s"), **extra)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_activation_hook_is_inert_without_the_variable(tmp_path: Path) -> None:
    plain = _probe(tmp_path, PROBE)
    assert plain == {
        "artifactstore": [],
        "wrapped": False,
        "chained": True,
        "meta_path": plain["meta_path"],
    }
    assert "_JaxImportHook" not in plain["meta_path"]
    assert not list(tmp_path.glob("s/**/*.db"))  # no store opened or created

    # Set, it activates only once JAX is imported: helpers that never import it pay nothing.
    no_jax = "import json, sys; print(json.dumps({'m': [m for m in sys.modules if 'jax' in m or "
    no_jax += "m.startswith('artifactstore') and m != 'artifactstore_startup'], "
    no_jax += "'chained': 'other_sitecustomize_ran' in sys.modules}))"
    report = tmp_path / "report"
    report.mkdir()
    on = {"ARTSTORE_WARM": str(report), "ARTSTORE_ACTIVATE": "1"}
    assert _probe(tmp_path, no_jax, **on) == {"m": [], "chained": True}
    active = _probe(tmp_path, PROBE, **on)
    assert active["wrapped"] and active["chained"]
    assert "artifactstore.warm.child" in active["artifactstore"]
    assert len(list(report.glob("*.json"))) == 1  # its record for the parent


def test_activation_hook_reads_the_same_variables_as_the_package() -> None:
    # The hook cannot import the package, so it keeps copies of the names; read them
    # without running the hook (importing it would install it in this process).
    hook = ast.parse((ACTIVATE_DIR / "artifactstore_startup.py").read_text())
    names = {
        target.id: node.value.value
        for node in hook.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert names["WARM_VAR"] == ENV_VAR == "ARTSTORE_WARM"
    assert names["URL_VAR"] == config.ENV_PREFIX + "URL"
    assert names["ACTIVATE_VAR"] == config.ENV_PREFIX + "ACTIVATE"
    assert sorted(p.name for p in ACTIVATE_DIR.iterdir() if p.suffix in (".py", ".pth")) == [
        "artifactstore_startup.pth",
        "artifactstore_startup.py",
        "sitecustomize.py",
    ]


# -- warm MODULE:FUNCTION ---------------------------------------------------------
def test_warm_specializations_in_parallel_then_skip_then_fresh_hits(
    store_env: dict[str, str], tmp_path: Path
) -> None:
    code, report, output = artstore_warm(
        "warm_specs:specializations", "-j", "2", env=store_env, tmp_path=tmp_path
    )
    assert code == 0, output
    assert (report["added"], report["present"], report["failed"]) == (5, 0, 0)
    names = [i["name"] for i in report["items"]]
    assert names == [f"embed(f32[{n},8], f32[8,8])" for n in (16, 32, 48, 64, 80)]
    assert all(i["status"] == "compiled" and i["xla_compiles"] == 1 for i in report["items"])
    assert len(json.loads(artstore("ls", "--json", env=store_env).stdout)) == 5
    assert "warming: 5/5" in output  # progress, one line per specialization off a terminal

    code, again, output = artstore_warm(
        "warm_specs:specializations", env=store_env, tmp_path=tmp_path
    )
    assert code == 0, output
    assert (again["added"], again["present"]) == (0, 5)
    assert all(i["status"] == "present" and i["xla_compiles"] == 0 for i in again["items"])
    assert "5 (loaded from the store, not compiled)" in output
    assert again["compile_secs_present"] == pytest.approx(report["compile_secs_added"])

    fresh = run_program("warm_specs.py", reader(store_env))
    assert fresh["xla_compiles"] == []
    assert fresh["store"]["hits"] == 5


def test_a_failing_specialization_is_named_and_the_rest_continue(
    store_env: dict[str, str], tmp_path: Path
) -> None:
    code, report, output = artstore_warm(
        "warm_specs:one_fails", "-j", "2", env=store_env, tmp_path=tmp_path
    )
    assert code == 1, output
    status = {i["name"]: i["status"] for i in report["items"]}
    assert status == {
        "embed(f32[16,8], f32[8,8])": "compiled",
        "mismatched": "failed",
        "embed(f32[32,8], f32[8,8])": "compiled",
    }
    [failed] = [i for i in report["items"] if i["status"] == "failed"]
    assert failed["error"].startswith("does not lower: TypeError")
    assert "FAILED mismatched: does not lower" in output

    # A specialization that takes its worker down: a fresh worker does the rest.
    code, crashed, output = artstore_warm(
        "warm_specs:one_crashes", env=store_env, tmp_path=tmp_path
    )
    assert code == 1, output
    assert [i["status"] for i in crashed["items"]] == ["present", "failed", "present"]
    assert crashed["items"][1]["error"].startswith("worker process exited with code 3")
    assert "worker logs kept in" in output

    code, named, output = artstore_warm("warm_specs:named", env=store_env, tmp_path=tmp_path)
    assert code == 0, output
    assert [i["name"] for i in named["items"]] == ["embed-16", "embed-32"]
    assert named["duplicates"] == 1 and named["present"] == 2  # stored by the run above


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module:specializations", "no module named 'no_such_module'"),
        ("warm_specs:missing", "module 'warm_specs' has no attribute 'missing'"),
        ("warm_specs:NOT_CALLABLE", "warm_specs:NOT_CALLABLE is int, not a function"),
        ("warm_specs:wrong_type", "warm_specs:wrong_type() returned int: expected an iterable"),
        ("warm_specs:not_jitted", "function is not a jitted function (wrap it with jax.jit)"),
        ("warm_specs:bad_specs", "argument specs must be a tuple of positional arguments"),
        ("warm_specs:raises", "raised RuntimeError: cannot list shapes today"),
        ("warm_specs:empty", "warm_specs:empty() returned no specializations"),
        ("warm_specs", "invalid target 'warm_specs': use MODULE:FUNCTION"),
    ],
)
def test_bad_targets_get_one_line_errors(
    store_env: dict[str, str], tmp_path: Path, target: str, message: str
) -> None:
    code, report, output = artstore_warm(target, env=store_env, tmp_path=tmp_path)
    assert code != 0 and report == {}
    [line] = output.strip().splitlines()
    assert line.startswith("artstore: error: ") and message in line, line


def test_usage_errors(store_env: dict[str, str], tmp_path: Path) -> None:
    for args, message in [
        ((), "give MODULE:FUNCTION or -- CMD"),
        (("-j", "2", "--", "python", "x.py"), "-j applies to MODULE:FUNCTION"),
        (("warm_specs:specializations", "--", "python"), "give MODULE:FUNCTION or -- CMD"),
        (("--",), "no command after --"),
    ]:
        code, _, output = artstore_warm(*args, env=store_env, tmp_path=tmp_path)
        assert code == 2 and message in output, output


# -- --expect-fingerprint -----------------------------------------------------------
def test_expect_fingerprint(store_env: dict[str, str], tmp_path: Path) -> None:
    here = json.loads(artstore("fingerprint", "--json", env=store_env).stdout)
    target = tmp_path / "target.json"
    target.write_text(json.dumps({**here, "device_kind": "NVIDIA H200", "device_count": 8}))
    marker = tmp_path / "ran"
    cmd = ["--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    code, _, output = artstore_warm(
        "--expect-fingerprint", str(target), *cmd, env=store_env, tmp_path=tmp_path
    )
    assert code == 1 and not marker.exists()  # refused before running anything
    [line] = output.strip().splitlines()
    assert line.startswith("artstore: error: this host does not match the expected target")
    assert "device_kind: 'cpu' here, 'NVIDIA H200' expected" in line
    assert "device_count: 1 here, 8 expected" in line

    absent = next(f for f in ("amx_tile", "avx512_fp16", "sme2", "zz_future_isa")
                  if f not in here["cpu_features"])  # fmt: skip
    other_cpu = {**here, "cpu_features": [*here["cpu_features"], absent]}
    code, _, output = artstore_warm(
        "--expect-fingerprint",
        json.dumps(other_cpu),
        "warm_specs:specializations",
        env=store_env,
        tmp_path=tmp_path,
    )
    assert code == 1 and f"cpu_features: missing here {absent}" in output
    assert json.loads(artstore("stats", "--json", env=store_env).stdout)["entries"] == 0

    target.write_text(json.dumps(here))
    code, report, output = artstore_warm(
        "--expect-fingerprint", str(target), "warm_specs:named", env=store_env, tmp_path=tmp_path
    )
    assert code == 0, output
    assert report["expected_fingerprint"] == here["digest"] and "(the expected target)" in output

    for bad, message in [
        ("{not json", "not valid JSON"),
        (str(tmp_path / "nope.json"), "cannot read --expect-fingerprint file"),
        ('{"a": 1}', "not a fingerprint"),
    ]:
        code, _, output = artstore_warm(
            "--expect-fingerprint", bad, *cmd, env=store_env, tmp_path=tmp_path
        )
        assert code == 1 and message in output and output.count("\n") == 1, output
