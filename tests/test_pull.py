"""`artstore pull`: this host's local tier filled from the object store, for one fingerprint.

The team-store tests count what reaches the moto S3 server through a logging proxy
in front of it (the server side of the HTTP connection; the client is not touched),
and give the pull an index URL no server answers: it never needs the database.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import OpenStore, artstore, clean_env, run_program
from faultproxy import FaultProxy

from artifactstore.blobstores.base import QUICK, RecordKind
from artifactstore.blobstores.local import LocalBlobStore
from artifactstore.bundles.pull import open_puller, pull
from artifactstore.cli.pull_cmd import summary
from artifactstore.config import resolve
from artifactstore.config.host import compute
from artifactstore.errors import StoreUnavailable
from artifactstore.formats import identity, quick
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.put import Put
from artifactstore.runtime.summary import Summary
from artifactstore.store import Store
from artifactstore.store.tier import LocalTier
from artifactstore.store.tiers import open_tier

# PostgreSQL URL on a port nothing listens on: opening the index would fail.
NO_INDEX = "postgresql+psycopg://postgres@127.0.0.1:1/artstore"
PAYLOAD = 3000  # random, so objects are about this big whatever the compression


def _fp(kind: str) -> Fingerprint:
    return compute(platform_name="cpu", platform_version="v", device_kind=kind,
                   device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


FP_A, FP_B = _fp("cpu-a"), _fp("cpu-b")


def _fill(store: Store, fp: Fingerprint, n: int, tag: str) -> dict[str, str]:
    """`n` entries for `fp`: key -> object digest."""
    out = {}
    for i in range(n):
        key = f"{tag}{i:063x}"
        assert store.put(
            Put(
                key,
                os.urandom(PAYLOAD),
                fingerprint=fp,
                module_name=f"jit_{tag}{i}",
                compile_secs=1.0,
            )
        )
        data = store.parts.blobs.get_manifest(key)
        assert data is not None
        out[key] = json.loads(data)["d"]
    return out


def _pull(env: dict[str, str], *args: str) -> dict[str, object]:
    proc = artstore("pull", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report: dict[str, object] = json.loads(proc.stdout)
    return report


def _tier(env: dict[str, str]) -> LocalTier:
    tier = open_tier(resolve(environ=env))
    assert tier is not None
    return tier


class _S3Log:
    """A logging proxy in front of the test's moto server."""

    def __init__(self, endpoint: str) -> None:
        port = int(endpoint.rsplit(":", 1)[1])
        self.proxy = FaultProxy(("127.0.0.1", port), log_requests=True).start()

    def take(self) -> list[str]:
        seen, self.proxy.requests[:] = list(self.proxy.requests), []
        return seen

    def object_gets(self, seen: list[str]) -> list[str]:
        """The digests of the objects GET (not manifests, listings or HEADs)."""
        paths = [line.split()[1].split("?")[0] for line in seen if line.startswith("GET ")]
        return sorted(p.rsplit("/", 1)[1] for p in paths if "/objects/" in p)

    @staticmethod
    def manifest_gets(seen: list[str]) -> int:
        return sum(1 for line in seen if line.startswith("GET ") and "/keys/" in line.split()[1]
                   and "list-type" not in line)  # fmt: skip


@pytest.fixture
def s3_log(team_env: dict[str, str]) -> Iterator[_S3Log]:
    log = _S3Log(team_env["AWS_ENDPOINT_URL_S3"])
    yield log
    log.proxy.stop()


def test_pull_fetches_exactly_this_fingerprints_entries_and_only_once(
    team_env: dict[str, str], open_store: OpenStore, s3_log: _S3Log, tmp_path: Path
) -> None:
    """A reader with no reachable index pulls A's entries: exactly A's objects are GET
    (counted at the server), none of B's; a second pull GETs no object at all; the
    tier then serves each of A's keys with the object store unreachable."""
    writer = open_store(team_env, local_tier="off")
    a = _fill(writer, FP_A, 3, "a")
    b = _fill(writer, FP_B, 2, "b")
    env = dict(team_env, AWS_ENDPOINT_URL_S3=s3_log.proxy.endpoint, ARTSTORE_INDEX=NO_INDEX,
               ARTSTORE_READ_ONLY="1", ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"))  # fmt: skip
    s3_log.take()

    dry = _pull(env, "--fingerprint", FP_A.digest, "--dry-run")
    assert dry["fetched"] == 3 and dry["dry_run"] is True
    assert sorted(item["key"] for item in dry["would_fetch"]) == sorted(a)  # type: ignore[union-attr]
    assert s3_log.object_gets(s3_log.take()) == []

    first = _pull(env, "--fingerprint", FP_A.digest, "-j", "3")
    seen = s3_log.take()
    assert all(line.startswith(("GET ", "HEAD ")) for line in seen), seen  # writes nothing
    assert s3_log.object_gets(seen) == sorted(a.values())
    assert (first["fetched"], first["present"], first["other_fingerprint"]) == (3, 0, 2)
    assert first["failed"] == 0 and first["ok"] is True

    second = _pull(env, "--fingerprint", FP_A.digest)
    seen = s3_log.take()
    assert s3_log.object_gets(seen) == [], seen
    assert s3_log.manifest_gets(seen) == len(b)  # what the tier holds needs no manifest
    assert (second["fetched"], second["present"], second["other_fingerprint"]) == (0, 3, 2)

    s3_log.proxy.set_mode("down")
    tier = _tier(env)
    for key in a:
        assert tier.get(key, FP_A.digest) is not None
    for key in b:
        assert tier.lookup(key) is None
    text = artstore("pull", "--fingerprint", FP_A.digest, env=dict(env, ARTSTORE_TIMEOUT="2"))
    assert text.returncode == 1 and text.stderr.count("\n") == 1, text.stderr
    assert "artstore: error:" in text.stderr and "Traceback" not in text.stderr


def test_pull_keeps_within_the_tier_bound(
    team_env: dict[str, str], open_store: OpenStore, s3_log: _S3Log, tmp_path: Path
) -> None:
    """A tier bound that holds two of three objects: two are fetched, the third is
    skipped and the summary says so; a second pull GETs no object."""
    writer = open_store(team_env, local_tier="off")
    a = _fill(writer, FP_A, 3, "a")
    size = max(blob.size for blob in writer.parts.blobs.iter_blobs())
    bound = 2 * size + size // 2
    env = dict(team_env, AWS_ENDPOINT_URL_S3=s3_log.proxy.endpoint, ARTSTORE_INDEX=NO_INDEX,
               ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"),
               ARTSTORE_LOCAL_TIER_SIZE=str(bound))  # fmt: skip
    s3_log.take()

    proc = artstore("pull", "--fingerprint", FP_A.digest, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "fetched 2 entries" in proc.stdout
    assert "1 skipped over the tier's bound" in proc.stdout
    assert "ARTSTORE_LOCAL_TIER_SIZE" in proc.stdout and proc.stdout.count("\n") == 1
    fetched = s3_log.object_gets(s3_log.take())
    assert len(fetched) == 2 and set(fetched) <= set(a.values())
    tier = _tier(env)
    assert tier.object_bytes() <= bound

    again = _pull(env, "--fingerprint", FP_A.digest)
    assert s3_log.object_gets(s3_log.take()) == []
    assert (again["fetched"], again["present"], again["over_bound"]) == (0, 2, 1)
    assert again["tier_bytes"] == tier.object_bytes() and again["tier_bound"] == bound


def test_pull_on_the_embedded_default(
    tmp_path: Path, open_store: OpenStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded default is its own tier: a pull fills its key map for this
    fingerprint (a warm process then opens neither the index nor another file)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    env = clean_env(XDG_CACHE_HOME=str(cache))
    writer = open_store(env, local_tier="off")  # so that the writer leaves no key map
    assert writer.parts.settings.embedded
    a = _fill(writer, FP_A, 2, "a")
    b = _fill(writer, FP_B, 1, "b")
    tier = _tier(env)
    assert not tier.owns_objects and all(tier.lookup(k) is None for k in [*a, *b])

    dry = artstore("pull", "--fingerprint", FP_A.digest, "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("would fetch ") == 3  # two entries and the summary
    assert all(tier.lookup(k) is None for k in a)

    first = _pull(env, "--fingerprint", FP_A.digest, "--module", "jit_a*")
    assert (first["fetched"], first["other_fingerprint"], first["tier_bound"]) == (2, 1, None)
    for key in a:
        assert tier.get(key, FP_A.digest) is not None
    assert tier.lookup(next(iter(b))) is None
    second = _pull(env, "--fingerprint", FP_A.digest)
    assert (second["fetched"], second["present"]) == (0, 2)
    only = _pull(env, "--fingerprint", FP_A.digest, "--module", "jit_a1")
    assert (only["present"], only["other_module"]) == (1, 1)
    text = artstore("pull", "--fingerprint", FP_B.digest, env=env)  # one: "1 entries" before
    assert text.stdout.startswith("fetched 1 entry ("), text.stdout + text.stderr


def test_pull_keeps_no_corrupt_or_untrusted_object(tmp_path: Path, open_store: OpenStore) -> None:
    """A damaged object, or with ARTSTORE_TRUSTED_KEYS an unsigned one, is counted and
    never enters the tier; the others do."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_READ_ONLY="1",
                    ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"))  # fmt: skip
    writer = open_store(dict(env, ARTSTORE_READ_ONLY="0"), local_tier="off")
    a = _fill(writer, FP_A, 2, "a")
    bad_key, bad_digest = next(iter(a.items()))
    path = tmp_path / "store" / "default" / "objects" / bad_digest[:2] / bad_digest
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    keys = tmp_path / "keys"
    keys.mkdir()
    assert artstore("keygen", "ci", "--dir", str(keys), env=env).returncode == 0
    trusting = dict(env, ARTSTORE_TRUSTED_KEYS=str(keys / "ci.pub"))
    unsigned = _pull(trusting, "--fingerprint", FP_A.digest)
    assert (unsigned["fetched"], unsigned["refused"], unsigned["corrupt"]) == (0, 1, 1)
    report = _pull(env, "--fingerprint", FP_A.digest)
    assert (report["fetched"], report["corrupt"]) == (1, 1)
    tier = _tier(env)
    assert tier.owns_objects and tier.lookup(bad_key) is None
    assert not tier.blobs.exists(bad_digest)
    assert sorted(b.digest for b in tier.blobs.iter_blobs()) == [a[k] for k in a if k != bad_key]


def test_pull_errors_are_one_line(tmp_path: Path) -> None:
    base = clean_env(ARTSTORE_URL=str(tmp_path / "nowhere"))
    cases = [
        (base, ["--fingerprint", "f" * 64], "no store at"),
        (dict(base, ARTSTORE_URL="s3://"), ["--fingerprint", "f" * 64], ""),
        (base, ["--fingerprint", "xyz"], "not a digest"),
        (dict(base, ARTSTORE_LOCAL_TIER="off"), ["--fingerprint", "f" * 64], "tier is off"),
    ]
    for env, args, words in cases:
        proc = artstore("pull", *args, env=env)
        assert proc.returncode != 0 and proc.stdout == "", (args, proc.stdout)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("artstore: error:")
        assert words in proc.stderr, proc.stderr
    assert not (tmp_path / "nowhere").exists()


def test_pulled_tier_serves_a_jax_program_with_the_store_down(
    team_env: dict[str, str], tmp_path: Path
) -> None:
    """End to end, real JAX: a program stores its executables; `artstore pull` (this
    host's fingerprint, computed as `artstore fingerprint` does) fills a fresh tier;
    a fresh process then loads every one from it with S3 and the database unreachable."""
    cold = run_program("job.py", team_env)
    assert cold["xla_compiles"] and cold["store"]["stored"] == len(cold["xla_compiles"])
    env = dict(team_env, ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"))
    # The object store alone: pull needs no ARTSTORE_INDEX (and fills the programs' tier).
    report = _pull({k: v for k, v in env.items() if k != "ARTSTORE_INDEX"})
    assert report["fetched"] == len(cold["xla_compiles"]) and report["other_fingerprint"] == 0
    down = dict(env, AWS_ENDPOINT_URL_S3="http://127.0.0.1:1", ARTSTORE_TIMEOUT="2",
                ARTSTORE_INDEX=NO_INDEX)  # fmt: skip
    warm = run_program("job.py", down)
    assert warm["xla_compiles"] == [] and warm["results"] == cold["results"]
    assert warm["store"]["tier_hits"] == len(cold["xla_compiles"])
    assert "artifactstore" not in warm["_stderr"]


def test_pull_learns_the_quick_keys_of_its_fingerprint_without_a_manifest(
    tmp_path: Path, open_store: OpenStore
) -> None:
    """Quick-key records of the pulled fingerprint join the tier's quick keys, from the
    listing alone; those of another fingerprint, those whose key has a manifest (stored
    since), and names that are not records' are left out. A dry run counts and writes
    nothing; a key pulled as an entry is no longer quick in the tier."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_READ_ONLY="1",
                    ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"))  # fmt: skip
    writer = open_store(dict(env, ARTSTORE_READ_ONLY="0"), local_tier="off")
    a = _fill(writer, FP_A, 2, "a")
    stored = next(iter(a))
    quick_a = [f"qa{i:062x}" for i in range(3)]
    for fp, key in [*((FP_A, k) for k in [*quick_a, stored]), (FP_B, "qb" + "0" * 62)]:
        writer.parts.blobs.put_record(QUICK, quick.quick_name(fp.digest, key), quick.encode(0.01))
    folder = tmp_path / "store" / "default" / QUICK.directory
    (folder / f"{FP_A.digest}.{'x' * 4}").write_text("{}")  # listed, not a record's name
    tier = _tier(env)
    tier.quick.remember(stored, 0.01)  # quick here once; stored by another host since
    tier.quick.save()

    dry = _pull(env, "--fingerprint", FP_A.digest, "--dry-run")
    assert dry["quick_keys"] == len(quick_a) and dry["quick_unlisted"] is None
    assert all(_tier(env).quick.get(k) is None for k in quick_a)
    text = artstore("pull", "--fingerprint", FP_A.digest, env=env)
    assert text.returncode == 0 and f"learned {len(quick_a)} keys too quick" in text.stdout
    tier = _tier(env)
    assert all(tier.quick.get(k) == 0.0 for k in quick_a)
    assert tier.quick.get(stored) is None and tier.get(stored, FP_A.digest) is not None
    assert tier.quick.get("qb" + "0" * 62) is None and tier.quick.get("x" * 4) is None
    again = _pull(env, "--fingerprint", FP_A.digest)
    assert (again["present"], again["quick_keys"]) == (2, len(quick_a))


class _QuickUnlisted(LocalBlobStore):
    """A store whose credentials predate quick/: listing it is refused."""

    def iter_records(self, kind: RecordKind, *, prefix: str = "") -> Iterator[str]:
        if kind is QUICK:
            raise StoreUnavailable("access denied for list quick-key records")
        return super().iter_records(kind, prefix=prefix)


def test_a_pull_refused_the_quick_keys_still_fetches_every_entry(
    tmp_path: Path, open_store: OpenStore
) -> None:
    """Credentials under policies older than quick/ cannot list it: the pull says so in
    its summary, learns no quick key, and succeeds with every entry fetched."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_READ_ONLY="1",
                    ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"))  # fmt: skip
    writer = open_store(dict(env, ARTSTORE_READ_ONLY="0"), local_tier="off")
    _fill(writer, FP_A, 2, "a")
    writer.parts.blobs.put_record(
        QUICK, quick.quick_name(FP_A.digest, "q" * 64), quick.encode(0.01)
    )
    puller = open_puller(resolve(environ=env))
    puller.store.parts.blobs = _QuickUnlisted(tmp_path / "store", "default")
    report = pull(puller, FP_A.digest)
    assert report.ok and (report.fetched, report.quick_keys) == (2, 0)
    assert report.quick_unlisted is not None and "access denied" in report.quick_unlisted
    assert "keys too quick to store not listed: access denied" in summary(report)
    assert _tier(env).quick.get("q" * 64) is None


def test_a_pulled_node_is_offline_warm(team_env: dict[str, str], tmp_path: Path) -> None:
    """Issue 32.3, end to end with real JAX: a writer runs a program whose trivial jits
    compile under ARTSTORE_MIN_COMPILE_SECS (never stored; it publishes them as quick)
    and whose two main functions are slow enough to store; `artstore pull` (the object
    store alone) fills a fresh tier; the program then runs with S3 and the index
    unreachable: no log line, no lookup, every stored entry a tier hit (loaded ahead: the
    pull copied the writer's working set), and the summary says so. Without the quick
    keys, each trivial jit would be looked up (and with the store down, logged).

    Slow: three fresh JAX processes, the writer's main compiles slowed by 1.2 s each.
    """
    env = dict(team_env, ARTSTORE_MIN_COMPILE_SECS="1", JOB_SMALL_JITS="1", ARTSTORE_PREFETCH="1")
    cold = run_program("job.py", dict(env, JOB_SLOW_COMPILE_SECS="1.2"))
    small = [m for m in cold["xla_compiles"] if "mlp" not in m and "loss_and_grad" not in m]
    assert small and cold["store"]["stored"] == 2, cold["store"]
    assert cold["store"]["quick_published"] == len(small) == cold["store"]["quick_compiles"]
    pulled = dict(env, ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"))
    report = _pull({k: v for k, v in pulled.items() if k != "ARTSTORE_INDEX"})
    assert (report["fetched"], report["quick_keys"]) == (2, len(small)), report
    assert report["working_sets"] == 1  # the writer's, so that the first run loads ahead

    down = dict(pulled, AWS_ENDPOINT_URL_S3="http://127.0.0.1:1", ARTSTORE_TIMEOUT="2",
                ARTSTORE_INDEX=NO_INDEX)  # fmt: skip
    warm = run_program("job.py", dict(down, JOB_WAIT_PREFETCH="2"))
    assert "artifactstore" not in warm["_stderr"], warm["_stderr"]
    assert warm["results"] == cold["results"] and warm["imported"] == [], warm["imported"]
    stats = warm["store"]
    assert stats["lookups_missed"] == 0 and stats["hits"] == stats["tier_hits"] == 2, stats
    assert stats.get("prefetched") == stats.get("prefetch_used") == 2, stats
    assert sorted(warm["xla_compiles"]) == sorted(small)
    summary = Summary.of([stats])
    assert (summary.hits, summary.compiles, summary.quick) == (2, 0, len(small))
    assert summary.degraded == 0 and summary.stored == 0


def test_pull_from_a_prefix_that_never_held_an_entry_fails_saying_so(
    team_env: dict[str, str], open_store: OpenStore, tmp_path: Path
) -> None:
    """A reader whose ARTSTORE_URL names an existing bucket but a prefix no writer ever
    used (moto): no manifest and no store identity there. The pull fetches nothing and
    says why in one line, exit 1. Once a writer made the namespace a store (its identity
    object) and nothing is stored yet, a pull of nothing is no failure."""
    wrong = team_env["ARTSTORE_URL"] + "-typo"
    env = dict(team_env, ARTSTORE_URL=wrong, ARTSTORE_INDEX=NO_INDEX, ARTSTORE_READ_ONLY="1",
               ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"))  # fmt: skip
    proc = artstore("pull", "--fingerprint", FP_A.digest, env=env)
    line = (
        f"{wrong}/default has never held an entry (no store identity, no manifests): "
        "check ARTSTORE_URL and ARTSTORE_NAMESPACE"
    )
    assert proc.returncode == 1 and proc.stderr == f"artstore: error: {line}\n", proc.stderr
    assert proc.stdout.startswith("fetched 0 entries") and proc.stdout.count("\n") == 1
    as_json = artstore("pull", "--json", "--dry-run", "--fingerprint", FP_A.digest, env=env)
    report = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and report["never_held"] == line and report["ok"] is False

    writer = open_store(dict(team_env, ARTSTORE_URL=wrong), local_tier="off")
    writer.parts.blobs.put_identity(identity.encode(uuid.uuid4().hex))  # what a first writer makes
    report = _pull(env, "--fingerprint", FP_A.digest)
    assert (report["fetched"], report["never_held"], report["ok"]) == (0, None, True)
