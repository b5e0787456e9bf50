"""Issue 29, point 4: each S3 policy of infra/policies allows exactly what its role's code does.

moto does not enforce IAM, so the check is by recording: every S3 call of the real boto3
client (a botocore `before-parameter-build` hook), against moto over HTTP, while each
role's code path runs -- the reader (a hit, a miss that waits on a writer's lease record,
its hit journal, `pull` with the quick keys it learns), the writer (single-flight: a lease
taken, waited on, abandoned and released; puts, a key too quick to store published, a
failed multipart upload, a corrupt object quarantined, `rm`, `pull`) and the operator
(`gc` with journals to fold and a quick key stored since, `verify --repair`, `db
rebuild`, `sign`). Each
call becomes the IAM action and resource AWS authorizes it by; the policy must allow
every one (a call it refuses is a feature that breaks under the documented roles, as
single-flight did: readers could not read `leases/*`) and must not allow an action on a
folder that the role's code never uses there.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from boto3.s3.transfer import TransferConfig
from conftest import OpenStore, bucket_of, s3_client

from artifactstore import config, gc
from artifactstore.blobstores.base import JOURNALS, LEASES, MANIFESTS, QUICK, WORKING_SETS
from artifactstore.blobstores.s3 import S3BlobStore
from artifactstore.bundles.pull import open_puller, pull
from artifactstore.config.keyfiles import generate, load_signing_key
from artifactstore.formats import codec
from artifactstore.formats import named as named_format
from artifactstore.formats.workingset import WorkingEntry, WorkingSet, program_id
from artifactstore.gc.rebuild import rebuild
from artifactstore.gc.remove import remove
from artifactstore.gc.sign import sign_entries
from artifactstore.gc.verify import verify
from artifactstore.store import Store, identity, removed
from security.flights import fp, key, loaded, publish, put, turn, waiting

POLICIES = Path(__file__).resolve().parents[2] / "infra" / "policies"
NS = "team-a"
MiB = 1024 * 1024
# Every folder of a namespace (artifactstore/blobstores/s3.py's layout).
FOLDERS = ("objects", "quarantine", MANIFESTS.folder, JOURNALS.folder, LEASES.folder,
           QUICK.folder, WORKING_SETS.folder)  # fmt: skip
# The object-level action AWS authorizes each call by (HeadObject is s3:GetObject's; a
# multipart upload and a copy's target are s3:PutObject's, a copy's source s3:GetObject's).
ACTIONS = {
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "CopyObject": "s3:PutObject",
    "UploadPartCopy": "s3:PutObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "ListParts": "s3:ListMultipartUploadParts",
    "DeleteObject": "s3:DeleteObject",
    "DeleteObjects": "s3:DeleteObject",  # authorized per key
}
Need = tuple[str, str]  # (action, object key) or ("s3:ListBucket", listed prefix)
# A PutObject with If-None-Match: *, and what a statement with the condition
# `"Null": {"s3:if-none-match": "false"}` grants: creating a key, never replacing one.
CREATE_ONLY = "s3:PutObject if-none-match"


@dataclass
class Recorder:
    """The S3 calls of each role, as its clients made them."""

    current: str = ""
    needs: dict[str, set[Need]] = field(default_factory=lambda: defaultdict(set))

    def add(self, role: str, blobs: S3BlobStore, op: str, params: dict[str, Any]) -> None:
        need = self.needs[role]
        if op in ("HeadBucket", "ListObjectsV2"):
            # HeadBucket needs an unconditioned ListBucket, which no policy grants: its
            # refusal makes check() list its objects' prefix instead (S3BlobStore.check).
            need.add(("s3:ListBucket", params.get("Prefix", blobs.objects_prefix)))
            return
        keys = [o["Key"] for o in params["Delete"]["Objects"]] if "Delete" in params else []
        keys = keys or [params["Key"]]
        if op not in ACTIONS:
            raise AssertionError(f"{role} made an S3 call this test does not know: {op}")
        action = ACTIONS[op]
        if op == "PutObject" and params.get("IfNoneMatch") == "*":
            action = CREATE_ONLY  # allowed by a create-only grant, or a plain one
        need.update((action, key) for key in keys)
        if op in ("CopyObject", "UploadPartCopy"):
            source = params["CopySource"]  # {"Bucket", "Key"}, or "bucket/key"
            src = source["Key"] if isinstance(source, dict) else source.split("/", 1)[1]
            need.add(("s3:GetObject", src))
        if op in ("GetObject", "HeadObject"):
            # A missing key may answer 403 under these policies: one listing of exactly
            # that key tells a miss from a denial (S3BlobStore._denied_but_absent).
            need.add(("s3:ListBucket", params["Key"]))


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """Every S3BlobStore made from now on records its calls under the role current then."""
    rec = Recorder()
    init, make = S3BlobStore.__init__, S3BlobStore._make_client

    def recording_init(self: S3BlobStore, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.test_role = rec.current  # type: ignore[attr-defined]

    def recording_client(self: S3BlobStore) -> Any:
        client = make(self)

        def hook(params: dict[str, Any], model: Any, **_: Any) -> None:
            rec.add(self.test_role, self, model.name, params)  # type: ignore[attr-defined]

        client.meta.events.register("before-parameter-build.s3", hook)
        return client

    monkeypatch.setattr(S3BlobStore, "__init__", recording_init)
    monkeypatch.setattr(S3BlobStore, "_make_client", recording_client)
    return rec


# -- the policies ------------------------------------------------------------------
@dataclass(frozen=True)
class Grant:
    action: str
    pattern: str  # an object key (ARN resource without the bucket) or an s3:prefix


def _statements(kind: str, bucket: str, prefix: str, effect: str) -> list[dict[str, Any]]:
    text = (POLICIES / f"s3-{kind}.json").read_text()
    for name, value in (("BUCKET", bucket), ("PREFIX", prefix), ("NAMESPACE", NS)):
        text = text.replace(name, value)
    statements = json.loads(text)["Statement"]
    assert {s["Effect"] for s in statements} <= {"Allow", "Deny"}
    return [s for s in statements if s["Effect"] == effect]


def _denials(kind: str, bucket: str, prefix: str, *, conditional: bool = False) -> list[Grant]:
    """What a role's policy refuses outright (Deny wins over every Allow in IAM); with
    `conditional`, what it refuses only under a condition (a put without If-None-Match)."""
    return [
        Grant(action, resource.removeprefix(f"arn:aws:s3:::{bucket}/"))
        for statement in _statements(kind, bucket, prefix, "Deny")
        if ("Condition" in statement) == conditional
        for action in statement["Action"]
        for resource in statement["Resource"]
    ]


def _grants(kind: str, bucket: str, prefix: str) -> list[Grant]:
    grants = []
    for statement in _statements(kind, bucket, prefix, "Allow"):
        for action in statement["Action"]:
            for resource in statement["Resource"]:
                if action == "s3:ListBucket":
                    assert resource == f"arn:aws:s3:::{bucket}"
                    for p in statement["Condition"]["StringLike"]["s3:prefix"]:
                        grants.append(Grant(action, p))
                else:
                    if statement.get("Condition") == {"Null": {"s3:if-none-match": "false"}}:
                        assert action == "s3:PutObject", statement
                        action = CREATE_ONLY
                    else:
                        assert "Condition" not in statement, statement  # one this test knows
                    grants.append(Grant(action, resource.removeprefix(f"arn:aws:s3:::{bucket}/")))
    return grants


def _grants_it(grant: Grant, action: str, value: str) -> bool:
    """A plain PutObject grant allows a create-only put too, never the other way."""
    same = grant.action == action or (action == CREATE_ONLY and grant.action == "s3:PutObject")
    return same and _matches(grant.pattern, value)


def _matches(pattern: str, value: str) -> bool:
    """IAM's wildcards: `*` any characters (`/` too), `?` one."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value) is not None


def _folder(value: str, prefix: str) -> str:
    rest = value.removeprefix(f"{prefix}/{NS}/")
    return rest.split("/", 1)[0] if rest != value else "(outside the namespace)"


def _mismatches(kind: str, needs: set[Need], bucket: str, prefix: str) -> list[str]:
    grants = _grants(kind, bucket, prefix)
    denials = _denials(kind, bucket, prefix)
    problems = [
        f"s3-{kind}.json refuses {action} on {value} (the {kind} path needs it)"
        for action, value in sorted(needs)
        if not any(_grants_it(g, action, value) for g in grants)
        or any(d.action == action and _matches(d.pattern, value) for d in denials)
    ]
    used = {(action, _folder(value, prefix)) for action, value in needs}
    for grant in grants:
        sample = "" if grant.action == "s3:ListBucket" else "x"
        covered = [f for f in FOLDERS if _matches(grant.pattern, f"{prefix}/{NS}/{f}/{sample}")]
        if _matches(grant.pattern, f"{prefix}/{NS}/identity"):  # one key, not a folder
            covered.append("identity")
        unused = [f for f in covered if (grant.action, f) not in used]
        if not covered or unused:
            problems.append(
                f"s3-{kind}.json allows {grant.action} on {grant.pattern}, but the {kind}'s "
                f"code never uses it on {', '.join(unused) or 'any folder of ours'}"
            )
    return problems


# -- the roles' code paths -----------------------------------------------------------
def _s3(store: Store) -> S3BlobStore:
    blobs: Any = store.parts.blobs
    while not isinstance(blobs, S3BlobStore):
        blobs = blobs.inner
    return blobs


def _writer_path(writer: Store, second: Store, reader: Store, raw: Any, bucket: str) -> None:
    # Single-flight: take a lease, publish; a second writer and a reader wait on leases.
    _, held = turn(writer, key(1))
    assert held is not None
    publish(writer, key(1), held)
    _, held = turn(writer, key(2))
    assert held is not None
    writer_flight = writer.flight
    assert writer_flight is not None
    writer_flight.drain(10)  # its lease record is in the bucket
    waiters = [waiting(second, key(2)), waiting(reader, key(2))]
    publish(writer, key(2), held)
    for thread, out in waiters:
        loaded(thread, out)
    _, held = turn(writer, key(3))  # a compile it will not store: abandoned
    assert held is not None
    held.release(stored=False)
    writer_flight.drain(10)
    for store in (writer, second, reader):
        assert store.parts.counters.snapshot().get("lease_errors", 0) == 0
    # A hit; a corrupt object quarantined on read; `artstore rm`.
    put(writer, key(4))
    assert writer.get(key(4), fp().digest) is not None
    entry = writer.parts.index.lookup(key(4))
    assert entry is not None
    raw.put_object(Bucket=bucket, Key=_s3(writer).key(entry.digest), Body=b"not an executable")
    assert writer.get(key(4), fp().digest) is None
    assert remove(writer, [key(1)]).objects == 1
    # `artstore verify --repair`, which writers run once after an upgrade (README).
    verify(writer, repair=True)
    _failed_multipart(writer)
    # Keys too quick to store: looked up, missed, compiled fast, so published (key(8)'s
    # is stored later: gc deletes its record).
    for quick in (key(8), key(9)):
        assert writer.get(quick, fp().digest) is None
        writer.compiled_below_threshold(quick, fp().digest, 0.01)
    assert writer.flush(30)
    assert writer.parts.counters.snapshot().get("quick_published") == 2
    # A program's working set: read at start (absent, then present), written at exit.
    _working_set(writer, write=True)


def _working_set(store: Store, *, write: bool) -> None:
    """What runtime.workingset does with the store: read the record, and (writers) put it."""
    name = program_id("/srv/train.py", fp().digest)
    found = store.parts.blobs.get_record(WORKING_SETS, name)
    if write:
        assert found is None
        record = WorkingSet(name, fp().digest, (WorkingEntry(key(4), b"options", (0,)),))
        store.parts.blobs.put_record(WORKING_SETS, name, record.encode())
        assert store.parts.blobs.get_record(WORKING_SETS, name) is not None
    else:
        assert found is not None


def _failed_multipart(store: Store) -> None:
    """A multipart upload (smaller parts here) that fails midway is aborted (s3transfer)."""
    s3 = _s3(store)
    s3.transfer_config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB,
                                        max_concurrency=1)  # fmt: skip

    def fail(**_: Any) -> None:
        raise ConnectionAbortedError("a part's upload failed")

    s3.client.meta.events.register("before-call.s3.UploadPart", fail)
    data = os.urandom(6 * MiB)
    with pytest.raises(Exception, match="failed"):
        s3.put(codec.digest_of(data), data)
    s3.client.meta.events.unregister("before-call.s3.UploadPart", fail)


def test_each_s3_policy_allows_exactly_what_its_role_does(
    team_env: dict[str, str], open_store: OpenStore, recorder: Recorder, tmp_path: Path
) -> None:
    env = {**team_env, "ARTSTORE_NAMESPACE": NS, "ARTSTORE_LOCAL_TIER": "off",
           "ARTSTORE_TIMEOUT": "30", "ARTSTORE_LEASE_WAIT": "60"}  # fmt: skip
    bucket, prefix = bucket_of(env)
    raw = s3_client(env)
    recorder.current = "writer"
    writer, second = open_store(env), open_store(env)
    recorder.current = "reader"
    reader = open_store(env, read_only=True, lazy_index=True)
    _writer_path(writer, second, reader, raw, bucket)
    # A writer pulls too (a CI node that warms and then runs).
    recorder.current = "writer"
    tier = {**env, "ARTSTORE_LOCAL_TIER": str(tmp_path / "writer-tier")}
    assert pull(open_puller(config.resolve(environ=tier)), fp().digest).quick_keys == 2
    recorder.current = "reader"

    # The reader: a hit, its hit journal, `artstore pull` into its tier.
    assert reader.get(key(2), fp().digest) is not None
    assert reader.get(key(10), fp().digest) is None
    reader.compiled_below_threshold(key(10), fp().digest, 0.01)  # read-only: not published
    reader.parts.accounts.flush()
    _working_set(reader, write=False)
    settings = config.resolve(
        {"read_only": True}, environ={**env, "ARTSTORE_LOCAL_TIER": str(tmp_path / "tier")}
    )
    pulled = pull(open_puller(settings), fp().digest)
    assert pulled.fetched >= 1 and pulled.quick_keys == 2 and pulled.quick_unlisted is None

    # A killed writer's lease record, left behind: gc reads it and removes it.
    recorder.current = "writer"
    writer.parts.blobs.put_record(LEASES, key(9), b"left by a writer killed while compiling")

    # The operator: gc (folds the journal, evicts, removes stale leases), verify --repair,
    # db rebuild, sign.
    recorder.current = "gc"
    operator = open_store(env)
    put(writer, key(5))
    put(writer, key(8))  # stored since it was quick: gc deletes its record
    identity.require_bound(operator.parts)  # what every changing command checks first
    out = gc.collect(operator, gc.Policy(max_bytes=1, grace_secs=0))
    assert out.journals_folded == 1 and out.entries_removed >= 1
    assert out.quick_records_removed == 1 and out.lease_records_removed == 1
    put(writer, key(6))
    put(writer, key(7))
    entry = writer.parts.index.lookup(key(6))
    assert entry is not None
    raw.put_object(Bucket=bucket, Key=_s3(writer).key(entry.digest), Body=b"corrupt")
    assert verify(operator, repair=True, grace_secs=0).corrupt
    with writer.parts.engine.begin() as conn:  # a lost index row, recovered from its manifest
        conn.exec_driver_sql("DELETE FROM entries WHERE key = %s", (key(7),))
    assert rebuild(operator).restored == [key(7)]
    secret, _ = generate("operator", tmp_path)
    assert sign_entries(operator, load_signing_key(secret)).signed >= 1
    _failed_multipart(operator)  # `sign` re-uploads objects through the same put
    # Junk a writer put where no identity was: `db bind --force --yes` replaces it
    # (the operator's credentials: writers may only create one).
    recorder.current = "writer"
    raw.delete_object(Bucket=bucket, Key=f"{prefix}/{NS}/identity")
    assert _s3(writer).put_identity(b"junk")  # create-only: allowed where none is
    assert not _s3(writer).put_identity(b"other junk")  # never replaced
    recorder.current = "gc"
    pair = (operator.parts.blobs, operator.parts.engine, NS, env["ARTSTORE_INDEX"])
    assert identity.bind(*pair, force=True, replace=True).ok

    problems = [
        problem
        for role in ("reader", "writer", "gc")
        for problem in _mismatches(role, recorder.needs[role], bucket, prefix)
    ]
    assert not problems, "\n".join(problems)


def test_a_writer_cannot_delete_a_removal_record() -> None:
    """A removed named version stays removed against writer credentials (issue 38.8): the
    writer policy denies deleting its removal record (any bytes put there still refuse
    the version), while the manifests and objects writers withdraw stay deletable. Only
    the gc role, the operator's, can take a removal back."""
    bucket, prefix = "b", "cache"
    record = f"{prefix}/{NS}/keys/{named_format.removed_name('t/step', '1')}"
    manifest = f"{prefix}/{NS}/keys/{key(1)}"

    def refused(kind: str, value: str) -> bool:
        return any(
            d.action == "s3:DeleteObject" and _matches(d.pattern, value)
            for d in _denials(kind, bucket, prefix)
        )

    assert refused("writer", record) and not refused("writer", manifest)
    assert not refused("gc", record)
    allowed = _grants("writer", bucket, prefix)
    assert any(g.action == "s3:PutObject" and _matches(g.pattern, record) for g in allowed)


def test_a_writer_cannot_replace_a_removal_record(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """Where signatures are required a removal record without a trusted signature is
    ignored, so replacing a signed one with junk would restore the version: the writer
    policy denies any put of one without If-None-Match (created once, never replaced),
    and `rm --name` creates it so (S3BlobStore.create_record, on moto over HTTP)."""
    bucket, prefix = "b", "cache"
    record = f"{prefix}/{NS}/keys/{named_format.removed_name('t/step', '1')}"
    [denied] = [s for s in _statements("writer", bucket, prefix, "Deny") if s.get("Condition")]
    assert denied["Action"] == ["s3:PutObject"] and denied["Condition"] == {
        "Null": {"s3:if-none-match": "true"}
    }
    assert any(_matches(r.removeprefix(f"arn:aws:s3:::{bucket}/"), record)
               for r in denied["Resource"])  # fmt: skip
    manifest = f"{prefix}/{NS}/keys/{key(1)}"
    assert not any(_matches(d.pattern, manifest)
                   for d in _denials("writer", bucket, prefix, conditional=True))  # fmt: skip
    blobs = open_store(team_env).parts.blobs
    name = named_format.removed_name("t/step", "1")
    assert blobs.create_record(removed.REMOVED, name, b"first")
    assert not blobs.create_record(removed.REMOVED, name, b"second")
    assert blobs.get_record(removed.REMOVED, name) == b"first"


def test_a_writer_may_create_the_identity_but_never_replace_or_delete_it() -> None:
    """A writer holding s3-writer.json could replace the identity object with junk and
    stop every writer and command of the store (measured before): its PutObject there
    now needs If-None-Match (create only), and only the gc role may delete it (what
    `db bind --force` does to replace junk, after a person said yes)."""
    bucket, prefix = "b", "cache"
    ident = f"{prefix}/{NS}/identity"
    for kind, deletes in (("writer", False), ("gc", True)):
        grants = _grants(kind, bucket, prefix)
        puts = {g.action for g in grants if "PutObject" in g.action and _matches(g.pattern, ident)}
        assert puts == {CREATE_ONLY}, (kind, puts)
        deleted = any(g.action == "s3:DeleteObject" and _matches(g.pattern, ident) for g in grants)
        assert deleted is deletes, kind
