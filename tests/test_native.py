"""Issue 47: named functions as native modules (IREE), checked against XLA, served.

End to end, on the CPU: a named function built, checked and stored
(tests/programs/native_job.py, one JAX process); a module that really disagrees with
XLA refused with nothing stored; one that cannot go native refused by the operation's
name; the module fetched by `artstore native get` and run by the `iree-run-module`
binary with XLA's results; `artifactstore.native.load` in a process that never
imports JAX; a tampered module never run. Without IREE these skip, except in CI on a
Python that IREE has wheels for (3.12+), where the native extra is installed and a
skip fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_CACHE, artstore, run_program
from security.ci_rules import in_ci

NATIVE_EXTRA = "pip install 'artifactstore[native]'"


def need_iree() -> None:
    """Skip without IREE, with the reason; fail instead in CI where a wheel exists."""
    missing = []
    for module in ("iree.compiler", "iree.runtime"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(module)
    if not missing:
        return
    reason = f"{' and '.join(missing)} not installed ({NATIVE_EXTRA})"
    if in_ci() and sys.version_info >= (3, 12):
        pytest.fail(f"CI must run the native tests (the native extra): {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One store with mlp@1's generic module built and checked; what the job said."""
    need_iree()
    from conftest import clean_env

    root = tmp_path_factory.mktemp("native")
    env = clean_env(ARTSTORE_URL=str(root / "store"))
    out = root / "arrays"
    out.mkdir()
    result = run_program("native_job.py", {**env, "NATIVE_OUT": str(out)}, timeout=600)
    return {"env": env, "root": root, "arrays": out, "job": result}


def test_built_checked_stored_and_refused_where_it_disagrees(built: dict[str, Any]) -> None:
    job = built["job"]
    assert job["present"] == [False, True]  # the second build found it stored
    assert [r["output"] for r in job["rows"]] == ["result[0]['h']", "result[0]['y']", "result[1]"]
    assert all(r["ok"] for r in job["rows"]) and job["cpu"] == "generic"
    assert job["rows"][2]["atol"] == 0.0  # integers: exact
    # The rewritten module (tanh -> sine) really ran and disagreed: named outputs, nothing stored.
    wrong = job["wrong"]
    assert wrong is not None and "disagrees with XLA, not stored" in wrong, wrong
    assert "result[0]['h'] (float32): max |diff|" in wrong
    assert job["entries"][0] == job["entries"][1]
    assert job["lapack"] is not None and "custom call" in job["lapack"], job["lapack"]
    assert "lapack" in job["lapack"].lower()


def _get(built: dict[str, Any], name: str) -> Path:
    target = built["root"] / name
    proc = artstore("native", "get", "mlp@1", "--target", "llvm-cpu", "-o", str(target),
                    env=built["env"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return target


def test_get_then_iree_run_module_gives_xla_results(built: dict[str, Any]) -> None:
    import numpy as np

    from artifactstore.native.iree import run_module_binary

    target = _get(built, "got")
    convention = json.loads((target / "mlp.json").read_text())
    assert convention["function"] == "main" and convention["cpu"] == "generic"
    assert convention["entry"] == "module.main"  # what a C program calls
    assert [x["shape"] for x in convention["module_inputs"]] == [[16], [8, 16], [4, 8]]
    assert convention["outputs"]["tree"] == {"tuple": [{"dict": [["h", "*"], ["y", "*"]]}, "*"]}
    arrays = built["arrays"]
    cmd = [run_module_binary(), f"--module={target / 'mlp.vmfb'}", "--function=main",
           "--device=local-task"]  # fmt: skip
    cmd += [f"--input=@{arrays / f'in{i}.npy'}" for i in range(3)]
    cmd += [f"--output=@{target / f'out{i}.npy'}" for i in range(3)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    for i in range(3):
        got, want = np.load(target / f"out{i}.npy"), np.load(arrays / f"xla{i}.npy")
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_commands_that_cannot_do_their_job_say_so_in_one_line(built: dict[str, Any]) -> None:
    from artifactstore.config.host import host_cpu_features
    from artifactstore.formats.fingerprint import _X86_FEATURES

    env = built["env"]
    lacking = sorted(_X86_FEATURES - set(host_cpu_features()))[0]
    for args, said in [
        (("build", "mlp@1", "--cpu", f"+{lacking}"), "this host lacks"),
        (("build", "mlp@1", "--target", "cuda"), "unknown native target 'cuda'"),
        (("get", "nope@1", "-o", str(built["root"] / "x")), "no portable form of nope@1"),
        (("get", "mlp@1", "--cpu", "host", "-o", str(built["root"] / "y")), "no native module"),
    ]:
        proc = artstore("native", *args, env=env)
        assert proc.returncode == 1, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and said in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


LOAD = """
import json, sys
import numpy as np
import artifactstore.native as native
arrays = sys.argv[1]
f = native.load("mlp", "1")
b, w, x = (np.load(f"{arrays}/in{i}.npy") for i in range(3))
out, idx = f({"w": w, "b": b}, x)
want = [np.load(f"{arrays}/xla{i}.npy") for i in range(3)]
got = (out["h"], out["y"], idx)
close = all(np.allclose(g, e, rtol=1e-4, atol=1e-5) for g, e in zip(got, want))
print(json.dumps({"close": close, "keys": sorted(out), "function": repr(f),
                  "jax": sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib"))}))
"""


def _load(built: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LOAD, str(built["arrays"])],
        env=built["env"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_native_load_never_imports_jax(built: dict[str, Any]) -> None:
    proc = _load(built)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["jax"] == [] and result["close"], result
    assert result["keys"] == ["h", "y"]


def test_a_tampered_module_is_never_run(built: dict[str, Any]) -> None:
    """Run last in this file: it damages the module's object where it is kept."""
    key = built["job"]["key"]
    from artifactstore import config
    from artifactstore.store import Store

    store = Store.open(config.resolve({}, environ=built["env"]))
    try:
        entry = store.parts.index.lookup(key)
        assert entry is not None
        digest = entry.digest
    finally:
        store.close()
    damaged = 0
    for base in (built["root"], TEST_CACHE):
        for path in base.rglob(f"*{digest}*"):
            if path.is_file():
                data = bytearray(path.read_bytes())
                data[len(data) // 2] ^= 0xFF
                os.chmod(path, 0o600)
                path.write_bytes(bytes(data))
                damaged += 1
    assert damaged >= 1
    proc = _load(built)
    assert proc.returncode != 0
    assert "NativeNotFound" in proc.stderr and "no native module of mlp@1" in proc.stderr
    assert "Traceback" in proc.stderr  # the program's own: a Python error, not a crash in IREE
