"""The portable form of a named executable, exported for several platforms.

A TPU build must load on a CPU host: `compiled(..., platforms=...)` exports the
`jax.export` form for each (default: the building host's platform and cpu). Here,
on a CPU-only machine, "built elsewhere" is simulated: the portable form is exported
for cpu and tpu (jax.export lowers for tpu without one), then a host with another
fingerprint (NAMED_OTHER_FP) rebuilds from it; a form exported for tpu alone is
refused in one line that names the platforms and the fix.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import artstore, run_program

from artifactstore.errors import ConfigError
from artifactstore.named import container, keys


def _job(env: dict[str, str], mode: str, **extra: str) -> dict[str, Any]:
    return run_program("named_job.py", {**env, "NAMED_MODE": mode, **extra})


def _portable_header(env: dict[str, str], open_store: Any) -> container.Header:
    """The stored portable form's header, as a loader reads it (verified payload)."""
    store = open_store(env)
    hit = store.get(keys.portable_key("mlp", "1"), keys.PORTABLE.digest)
    assert hit is not None
    header, _ = container.decode(bytes(hit.payload))
    assert header.kind == "portable"
    return header


def test_portable_form_for_cpu_and_tpu_rebuilds_on_another_cpu_host(
    store_env: dict[str, str], open_store: Any
) -> None:
    built = _job(store_env, "compiled", NAMED_PLATFORMS="cpu,tpu")
    assert built["source"] == "compiled", built
    assert _portable_header(store_env, open_store).platform == "cpu,tpu"
    rebuilt = _job(store_env, "load", NAMED_OTHER_FP="1")
    assert rebuilt["source"] == "portable", rebuilt
    assert rebuilt["digest"] == built["digest"] and not rebuilt["model_imported"]


def test_default_exports_for_this_platform_and_cpu(
    store_env: dict[str, str], open_store: Any
) -> None:
    _job(store_env, "compiled")
    assert _portable_header(store_env, open_store).platform == "cpu"  # this host is cpu


def test_portable_form_for_tpu_alone_is_refused_on_cpu_in_one_line(
    store_env: dict[str, str], open_store: Any
) -> None:
    _job(store_env, "compiled", NAMED_PLATFORMS="tpu")  # as a TPU job with platforms=("tpu",)
    assert _portable_header(store_env, open_store).platform == "tpu"
    out = _job(store_env, "load", NAMED_OTHER_FP="1")
    assert out["error"] == "NamedNotFound", out
    message = out["message"]
    assert "\n" not in message
    assert "mlp@1: its portable form was exported for tpu only, and this host runs cpu" in message
    assert "platforms=('tpu', 'cpu')" in message
    # A host with the source builds it instead (one warning), and still gets a result.
    compiled = _job(store_env, "compiled", NAMED_OTHER_FP="1", NAMED_PLATFORMS="tpu")
    assert compiled["source"] == "compiled" and compiled["calls"] == 1
    assert "exported for tpu only" in compiled["_stderr"]
    listing = json.loads(artstore("ls", "--json", env=store_env).stdout)
    named = sorted(e["device_kind"] for e in listing if e["module_name"] == "named:mlp@1")
    assert named == ["any", "cpu", "cpu-other-kind"]


def _eig(x: Any) -> Any:
    import jax.numpy as jnp

    return jnp.linalg.eig(x)[0].real  # XLA lowers eig for cpu (and gpu), not for tpu


def test_export_falls_back_to_this_platform_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import jax
    import jax.numpy as jnp

    from artifactstore.named import portable
    from artifactstore.named.signature import Leaf, Signature

    spec = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    sig = Signature.of((spec,), lambda s: Leaf(tuple(s.shape), str(s.dtype)), path="args")
    header = container.Header(
        kind="native", name="eig", version="1", inputs=sig, outputs=sig,
        jax_version=jax.__version__, devices=(0,), platform="cpu",
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="artifactstore"):
        payload = portable.export(_eig, (spec,), frozenset(), header, ("cpu", "tpu"))
        assert payload is not None
        again = portable.export(_eig, (spec,), frozenset(), header, ("cpu", "tpu"))
    assert container.decode(payload)[0].platform == "cpu"
    assert again is not None and container.decode(again)[0].platform == "cpu"
    said = [r.getMessage() for r in caplog.records if "eig@1" in r.getMessage()]
    assert len(said) == 1, said
    assert "portable form exported for cpu alone (not for tpu" in said[0]
    # Asked for tpu alone, where it has no lowering: no portable form, said once.
    assert portable.export(_eig, (spec,), frozenset(), header, ("tpu",)) is None


def test_platforms_are_checked_in_one_line() -> None:
    assert keys.check_platforms(None) is None
    assert keys.check_platforms("tpu") == ("tpu",)
    assert keys.check_platforms(["tpu", "cpu", "tpu"]) == ("tpu", "cpu")
    for bad in (("gpu",), ("cpu", "tup"), ()):
        with pytest.raises(ConfigError) as err:
            keys.check_platforms(bad)
        assert "\n" not in str(err.value) and "cpu, cuda, rocm, tpu" in str(err.value)


WARM_SPECS = """
import jax, jax.numpy as jnp
import artifactstore

def double(x):
    return x * 2

def specs():
    x = jax.ShapeDtypeStruct((4,), jnp.float32)
    return [artifactstore.NamedSpec(double, x, name="mlp", version="1", platforms=("cpu", "tpu"))]
"""


def test_warm_named_specs_pass_platforms(
    store_env: dict[str, str], open_store: Any, tmp_path: Path
) -> None:
    (tmp_path / "warm_platforms.py").write_text(WARM_SPECS)
    path = os.pathsep.join(p for p in (str(tmp_path), store_env.get("PYTHONPATH")) if p)
    env = {**store_env, "PYTHONPATH": path}
    out = artstore("warm", "warm_platforms:specs", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert _portable_header(store_env, open_store).platform == "cpu,tpu"
