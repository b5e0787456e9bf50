"""Named executables: built once, then loaded by name in fresh processes with no trace.

Real JAX in fresh interpreters (tests/programs/named_job.py): the model's function
body counts its own runs, and JAX's trace/lower/compile monitoring events are
recorded; both must stay at zero in a loading process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import TEAM_SIGNING, artstore, clean_env, run_program

from artifactstore.errors import CorruptObject
from artifactstore.named import container, keys
from artifactstore.named.signature import (
    Leaf,
    NamedCallError,
    Signature,
    UnsupportedTree,
    check_array,
)


def _job(env: dict[str, str], mode: str, **extra: str) -> dict[str, Any]:
    return run_program("named_job.py", {**env, "NAMED_MODE": mode, **extra})


def test_fresh_process_loads_without_tracing_with_identical_results(
    any_env: dict[str, str],
) -> None:
    built = _job(any_env, "compiled")
    assert built["source"] == "compiled", built
    assert built["calls"] == 1 and built["event_count"] > 0
    again = _job(any_env, "compiled")  # the function is importable, but never called
    assert again["source"] == "store", again
    assert again["calls"] == 0
    assert again["events"] == [], again["events"]
    assert again["digest"] == built["digest"]
    loaded = _job(any_env, "load")  # the defining module cannot be imported
    assert loaded["source"] == "store" and not loaded["model_imported"]
    assert loaded["events"] == [] and loaded["digest"] == built["digest"]
    assert loaded["aux_is_none"]
    # Calls go through JAX's C++ path (a stub's trace wraps the executable; no compile).
    assert again["fast"] and loaded["fast"] and built["fast"]
    assert loaded["checked_calls"] == [0, 5]  # the five wrong calls: named by the checked path


def test_wrong_arguments_are_clear_errors(store_env: dict[str, str]) -> None:
    _job(store_env, "compiled")
    errors = _job(store_env, "load")["errors"]
    assert errors["shape"] == "args[1]: expected float32[4,16], got float32[4,8]"
    assert errors["dtype"] == "args[1]: expected float32[4,16], got int32[4,16]"
    assert errors["structure"] == "args[0]: dict keys differ: missing ['b']"
    assert "static argument" in errors["static"] and "built for 3, got 4" in errors["static"]
    assert errors["count"] == "args: expected 3 items, got 2"


def test_another_fingerprint_rebuilds_from_stablehlo_and_stores_it(
    store_env: dict[str, str],
) -> None:
    built = _job(store_env, "compiled")
    rebuilt = _job(store_env, "load", NAMED_OTHER_FP="1")
    assert rebuilt["source"] == "portable", rebuilt  # no source, no native entry for it
    assert rebuilt["digest"] == built["digest"]
    native = _job(store_env, "load", NAMED_OTHER_FP="1")
    assert native["source"] == "store" and native["events"] == []
    assert native["digest"] == built["digest"]
    listing = json.loads(artstore("ls", "--json", env=store_env).stdout)
    named = sorted(e["device_kind"] for e in listing if e["module_name"] == "named:mlp@1")
    assert named == ["any", "cpu", "cpu-other-kind"]  # portable + two native


def test_portable_form_outside_the_compatibility_window_is_refused_clearly(
    store_env: dict[str, str],
) -> None:
    _job(store_env, "compiled")
    out = _job(store_env, "load", NAMED_OTHER_FP="1", NAMED_MIN_CCV="99")
    assert out["error"] == "NamedNotFound", out
    assert "calling convention" in out["message"] and "too old" in out["message"]
    assert "rebuild it with artifactstore.compiled" in out["message"]
    rebuilt = _job(store_env, "compiled", NAMED_OTHER_FP="1", NAMED_MIN_CCV="99")
    assert rebuilt["source"] == "compiled" and rebuilt["calls"] == 1  # it has the source


def test_load_of_an_unknown_name_says_how_to_build_it(store_env: dict[str, str]) -> None:
    out = _job(store_env, "load")
    assert out["error"] == "NamedNotFound"
    assert "no executable mlp@1 for this host" in out["message"]
    assert "artifactstore.compiled" in out["message"]


def test_trusted_keys_refuse_unsigned_named_executables(
    store_env: dict[str, str], tmp_path: Path
) -> None:
    _job(store_env, "compiled")  # unsigned
    made = artstore("keygen", "ci", "--dir", str(tmp_path), env=clean_env())
    assert made.returncode == 0, made.stderr
    reader = {**store_env, "ARTSTORE_TRUSTED_KEYS": str(tmp_path / "ci.pub")}
    out = _job(reader, "load")
    assert out["error"] == "NamedNotFound" and "refused: unsigned" in out["message"]
    signer = {**reader, "ARTSTORE_SIGNING_KEY": str(tmp_path / "ci.key")}
    rebuilt = _job(signer, "compiled")  # has the source: compiles and stores a signed one
    assert rebuilt["source"] == "compiled" and rebuilt["calls"] == 1
    assert _job(reader, "load")["source"] == "store"


# -- the declarative signature and container (no JAX) -----------------------------------
class _Spec:
    def __init__(self, shape: tuple[int, ...], dtype: str = "float32") -> None:
        self.shape, self.dtype = shape, dtype


def _sig(value: Any, static: set[str] = frozenset()) -> Signature:  # type: ignore[assignment]
    return Signature.of(value, lambda s: Leaf(tuple(s.shape), s.dtype), path="args",
                        static=lambda p: p in static)  # fmt: skip


def test_signature_round_trips_as_json_and_names_the_first_mismatch() -> None:
    sig = _sig(({"b": _Spec((2,)), "a": [_Spec((3, 3)), None]}, 5), {"args[1]"})
    assert Signature.from_json(json.loads(json.dumps(sig.to_json()))) == sig
    assert sig.describe() == "({'a': [float32[3,3], None], 'b': float32[2]}, static 5)"

    def check(value: Any, spec: Leaf, path: str) -> Any:
        check_array(value, spec, path)
        return value

    ok = ({"a": [_Spec((3, 3)), None], "b": _Spec((2,))}, 5)
    assert len(sig.flatten(ok, path="args", check=check)) == 2
    bad = [
        (({"a": [_Spec((3, 3)), None], "b": _Spec((2,), "int32")}, 5),
         "args[0]['b']: expected float32[2], got int32[2]"),
        (({"a": (_Spec((3, 3)), None), "b": _Spec((2,))}, 5),
         "args[0]['a']: expected a list, got tuple"),
        (({"a": [_Spec((3, 3)), 1.0], "b": _Spec((2,))}, 5),
         "args[0]['a'][1]: expected None, got float"),
        (({"a": [_Spec((3, 3)), None], "b": _Spec((2,)), "c": None}, 5),
         "args[0]: dict keys differ: unexpected ['c']"),
        (({"a": [_Spec((3, 3)), None], "b": _Spec((2,))}, 6),
         "args[1]: a static argument; this executable was built for 5, got 6"),
    ]  # fmt: skip
    for value, message in bad:
        with pytest.raises(NamedCallError) as err:
            sig.flatten(value, path="args", check=check)
        assert str(err.value) == message
    scalar = _sig((_Spec(()),))
    scalar.flatten((2.0,), path="args", check=check)  # a Python float for float32[]
    with pytest.raises(NamedCallError, match="got a Python bool"):
        scalar.flatten((True,), path="args", check=check)


def test_signature_refuses_what_it_cannot_describe_and_malformed_json() -> None:
    from collections import namedtuple

    Pair = namedtuple("Pair", "a b")
    with pytest.raises(UnsupportedTree, match=r"Pair cannot be stored"):
        _sig((Pair(_Spec((1,)), _Spec((1,))),))
    with pytest.raises(UnsupportedTree, match="static argument"):
        _sig((object(),), {"args[0]"})
    for tree in ({"set": []}, {"dict": [["b", "*"], ["a", "*"]]}, "**", {"tuple": "*"}):
        with pytest.raises(ValueError):
            Signature.from_json({"tree": tree, "leaves": []})
    with pytest.raises(ValueError, match="leaf slots"):
        Signature.from_json({"tree": {"tuple": ["*", "*"]}, "leaves": []})


def test_container_round_trip_and_refusals() -> None:
    sig = _sig((_Spec((2,)),))
    header = container.Header("native", "m", "1", sig, sig, "0.12", (0,), "cpu")
    payload = container.encode(header, b"body")
    assert container.decode(payload) == (header, b"body")
    for bad in (b"not named", payload[:20], payload.replace(b"\x01", b"\x09", 1)):
        with pytest.raises(CorruptObject):
            container.decode(bad)


def test_keys_and_module_names() -> None:
    assert keys.parse_module_name(keys.module_name("fold/len-256", "2.1")) == (
        "fold/len-256",
        "2.1",
    )
    assert keys.parse_module_name("jit_step") is None
    assert keys.key("a", "1", "f") != keys.key("a", "2", "f") != keys.portable_key("a", "1")
    assert keys.matches("named:fold/len-256@1", "fold/*")
    assert not keys.matches("named:fold/len-256@1", "fold/*", "2")
    assert keys.parse_ref("fold@3") == ("fold", "3") and keys.parse_ref("fold") == ("fold", None)
    for bad in ("", "../x", "a b", "-x"):
        with pytest.raises(Exception, match="invalid executable name"):
            keys.check_name(bad)


def test_warm_builds_named_executables_from_a_spec_list(
    store_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**store_env, "PYTHONPATH": str(Path(__file__).parent / "programs")}

    def warm() -> dict[str, Any]:
        out = artstore("warm", "--report-json", str(tmp_path / "r.json"), "warm_named:specs",
                       env=env)  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        report: dict[str, Any] = json.loads((tmp_path / "r.json").read_text())
        return report

    report = warm()
    assert [i["name"] for i in report["items"]] == [f"fold/len-{n}@1" for n in (16, 32, 48)]
    assert {i["status"] for i in report["items"]} == {"compiled"}
    assert {i["status"] for i in warm()["items"]} == {"present"}
    listing = json.loads(artstore("ls", "--json", env=store_env).stdout)
    modules = sorted(e["module_name"] for e in listing)
    assert modules == sorted([f"named:fold/len-{n}@1" for n in (16, 32, 48)] * 2)  # + portable


DECORATOR_PROGRAM = """
import json, sys
import jax, jax.numpy as jnp
import artifactstore

out = {}

@artifactstore.compiled(jax.ShapeDtypeStruct((3,), jnp.float32), 2, name="pow", version="1",
                        static_argnums=1)
def power(x, n):
    return x ** n

out["power"] = [float(v) for v in power(jnp.arange(3, dtype=jnp.float32), 2)]
out["source"] = power.source

def noisy(x):
    jax.debug.print("x={x}", x=x)
    return x + 1

try:
    artifactstore.compiled(noisy, jax.ShapeDtypeStruct((3,), jnp.float32), name="noisy",
                           version="1")
except artifactstore.NamedBuildError as exc:
    out["callbacks"] = str(exc)
try:
    power(jnp.ones(3), 2, extra=1)
except artifactstore.NamedCallError as exc:
    out["kwargs"] = str(exc)
try:
    artifactstore.compiled(lambda x: x, jax.ShapeDtypeStruct((4,), jnp.float32), name="pow",
                           version="1")
except artifactstore.NamedCallError as exc:
    out["changed_specs"] = str(exc)
try:
    artifactstore.compiled(lambda x: x, 1.0, name="bad name!", version="1")
except artifactstore.ArtstoreError as exc:
    out["bad_name"] = str(exc)
print(json.dumps(out))
"""


def test_decorator_form_static_arguments_and_refusals(store_env: dict[str, str]) -> None:
    import subprocess
    import sys

    def run() -> dict[str, Any]:
        proc = subprocess.run([sys.executable, "-c", DECORATOR_PROGRAM], env=store_env,
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result

    out = run()
    assert out["power"] == [0.0, 1.0, 4.0] and out["source"] == "compiled"
    assert "host callbacks or side effects" in out["callbacks"]
    assert "positional arguments only" in out["kwargs"]
    assert "give the new specs a new version" in out["changed_specs"]
    assert out["bad_name"].startswith("invalid executable name 'bad name!'")
    assert run()["source"] == "store"


SHARDED_PROGRAM = """
import json, numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import artifactstore
mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
rows, replicated = NamedSharding(mesh, P("d", None)), NamedSharding(mesh, P())
def f(x, w):
    return {"y": jnp.tanh(x @ w), "s": (x @ w).sum()}
specs = (jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=rows),
         jax.ShapeDtypeStruct((4, 4), jnp.float32, sharding=replicated))
g = artifactstore.compiled(f, *specs, name="sharded", version="1")
x = np.arange(32, dtype=np.float32).reshape(8, 4) / 32
out = g(x, np.eye(4, dtype=np.float32))
print(json.dumps({"source": g.source, "y": np.asarray(out["y"]).tolist(),
                  "s": float(out["s"]), "spec": [str(a) for a in out["y"].sharding.spec],
                  "devices": len(out["y"].sharding.device_set)}))
"""


def test_sharded_inputs_and_outputs_over_two_devices(store_env: dict[str, str]) -> None:
    import subprocess
    import sys

    env = {**store_env, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}

    def run() -> dict[str, Any]:
        proc = subprocess.run([sys.executable, "-c", SHARDED_PROGRAM], env=env,
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result

    built, loaded = run(), run()
    assert (built["source"], loaded["source"]) == ("compiled", "store")
    assert loaded["y"] == built["y"] and loaded["s"] == built["s"]
    assert loaded["devices"] == 2 and loaded["spec"] == ["d", "None"]


def test_store_down_builds_and_runs_and_load_says_why(tmp_path: Path) -> None:
    down = clean_env(
        ARTSTORE_URL="s3://nowhere/cache",
        ARTSTORE_INDEX="postgresql+psycopg://postgres@127.0.0.1:1/artstore",
        AWS_ENDPOINT_URL_S3="http://127.0.0.1:1",
        AWS_ACCESS_KEY_ID="k",
        AWS_SECRET_ACCESS_KEY="s",
        ARTSTORE_TIMEOUT="2",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )
    built = _job(down, "compiled")
    assert built["source"] == "compiled" and built["calls"] == 1 and built["digest"]
    assert built["errors"]["shape"].startswith("args[1]: expected")
    out = _job(down, "load")
    assert out["error"] == "NamedNotFound" and "unavailable" in out["message"], out


def test_load_export_import_load_round_trip(any_env: dict[str, str], tmp_path: Path) -> None:
    """The re-serialization trap: what a loading process exports must load elsewhere.

    On some jaxlibs an executable loaded from bytes and serialized again no longer
    loads; named entries and bundles carry only the bytes a fresh compile made."""
    source = clean_env(ARTSTORE_URL=str(tmp_path / "source"), **TEAM_SIGNING)  # team: signed
    built = _job(source, "compiled")
    assert _job(source, "load")["source"] == "store"  # loaded once before it travels
    bundle = tmp_path / "mlp.bundle"
    out = artstore("export", str(bundle), "--name", "mlp@1", env=source)
    assert out.returncode == 0, out.stderr
    into = artstore("import", "--json", str(bundle), env=any_env)
    assert into.returncode == 0, into.stderr
    loaded = _job(any_env, "load")  # another store, another process, no source
    assert loaded["source"] == "store" and loaded["events"] == []
    assert loaded["digest"] == built["digest"]
    named = json.loads(artstore("ls", "--named", "--json", env=any_env).stdout)
    assert len(named) == 2  # the native executable and its portable form
