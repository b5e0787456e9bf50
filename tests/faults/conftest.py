"""Fixtures of the fault suite: one team store behind fault proxies for the whole suite."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import artstore, devstack
from faultproxy import FaultProxy

from faults.harness import RUNNING, Job, Stack, reference_results


@pytest.fixture(scope="session")
def stack(
    moto_endpoint: str, postgres: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A bucket on the moto server and a database on the local PostgreSQL, each reached
    through a FaultProxy; every cell works in a namespace of its own."""
    port = int(moto_endpoint.rsplit(":", 1)[1])
    s3_proxy = FaultProxy(("127.0.0.1", port)).start()
    pg_proxy = FaultProxy(("127.0.0.1", devstack.PG_PORT)).start()
    bucket = "faults-" + uuid.uuid4().hex[:12]
    devstack.create_bucket(moto_endpoint, bucket)
    db_name = "artstore_f_" + uuid.uuid4().hex[:12]
    db_url = devstack.create_database(db_name)
    proxied = db_url.replace(f":{devstack.PG_PORT}/", f":{pg_proxy.port}/", 1)
    assert proxied != db_url, db_url
    stack = Stack(
        moto_endpoint, s3_proxy, pg_proxy, bucket, db_name, db_url, proxied,
        tmp_path_factory.mktemp("faults"),
    )  # fmt: skip
    up = artstore("db", "upgrade", env=stack._direct_env("default"))
    assert up.returncode == 0, up.stderr
    try:
        yield stack
    finally:
        stack.clear()
        s3_proxy.stop()
        pg_proxy.stop()
        devstack.drop_database(db_name)


@pytest.fixture(autouse=True)
def _healthy_again(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every fault ends with its test: proxies back to pass, locks released, programs gone."""
    yield
    while RUNNING:
        RUNNING.pop().stop()
    if "stack" in request.fixturenames:
        request.getfixturevalue("stack").clear()


@pytest.fixture(scope="session")
def warm(stack: Stack) -> str:
    """A namespace filled once by a writer, shared by the cells that leave it as it was."""
    return stack.warm("warm")


@pytest.fixture(scope="session")
def warm_keys(stack: Stack, warm: str) -> set[str]:
    """The keys of the warm namespace: every cell ends with all of them still there.
    (And the cells' shortcuts around the CLI, `ls` and `verify`, say what it says.)"""
    listed = stack.cli_ls(warm)
    assert {k: e["digest"] for k, e in listed.items()} == {
        k: e["digest"] for k, e in stack.ls(warm).items()
    }
    cli = artstore("verify", "--json", env=stack._direct_env(warm))
    assert cli.stdout and json.loads(cli.stdout) == stack.verify(warm), cli.stderr
    return set(listed)


@pytest.fixture(scope="session")
def gc_baseline(stack: Stack, warm: str) -> float:
    """Seconds a healthy `artstore gc --grace 0s` takes here."""
    gc = stack.cli(warm, "gc", "--grace", "0s")
    assert gc.returncode == 0, gc.stderr
    return gc.secs


@pytest.fixture(scope="session")
def references() -> dict[str, list[str]]:
    """job.py's results without the store, per JOB_VARIANT (filled on first use)."""
    cache: dict[str, list[str]] = {}
    reference_results(cache)
    return cache


@pytest.fixture(scope="session")
def baselines(stack: Stack, warm: str) -> dict[str, float]:
    """Seconds from "go" to exit of a paused reader and writer without a fault: what a
    faulted cell's extra time is measured against."""
    reader = Job(stack.env(warm, JOB_PAUSE="open", ARTSTORE_READ_ONLY="1")).start()
    reader.paused("open")
    reader.go()
    reader.wait()
    assert reader.out["store"]["hits"] > 0, reader.out
    writer = Job(stack.env("base-" + uuid.uuid4().hex[:8], JOB_PAUSE="open")).start()
    writer.paused("open")
    writer.go()
    writer.wait()
    assert writer.out["store"]["stored"] > 0, writer.out
    return {"read": reader.secs, "write": writer.secs}


@pytest.fixture(scope="session")
def full_tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    from faults.harness import full_filesystem

    with full_filesystem(tmp_path_factory.mktemp("fullfs")) as made:
        yield made
