"""The S3 contract: every call the store makes, asserted the same way on moto and on Ceph's
RADOS Gateway (issue 49).

Each test runs on both servers (`s3_server`, tests/s3servers.py: the RGW one is started
once per session by `devstack up --s3 rgw`). Where the servers differ, the difference is
a field of S3Server, measured here and written down in docs/operations.md ("S3 servers"):
storage classes (AWS and moto refuse an archived object; RGW 16.2 serves it), credentials
(moto accepts any without its IAM auth), and x-amz-checksum-* headers (RGW 16.2 ignores
them). What the store answers is asserted for each.
A server that ignores `If-None-Match: *` (neither does, measured with eight writers racing)
is made here by removing the header from the store's requests, as such a server would
ignore it: the store must say so once and never let two identities be created.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from typing import Any

import botocore.auth
import botocore.exceptions as bce
import pytest
from s3servers import S3Server
from test_s3_blobstore import blob, count_calls

from artifactstore.blobstores.s3 import MiB, Multipart, S3BlobStore
from artifactstore.errors import ObjectUnreadable, OverLimit, StoreUnavailable
from artifactstore.formats.named import removed_name
from artifactstore.store.removed import REMOVED


@pytest.fixture
def server(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server, its user's credentials where the store's boto3 reads them."""
    for name, value in s3_server.aws_env().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    return s3_server


@pytest.fixture
def bucket(server: S3Server) -> str:
    return server.new_bucket()


RECORD = removed_name("a-named-function", "1")  # a removal record's name


def make_store(server: S3Server, bucket: str, **kw: Any) -> S3BlobStore:
    args: dict[str, Any] = {"prefix": "team/cache", "namespace": "default",
                            "endpoint_url": server.endpoint, "timeout_secs": 10.0}  # fmt: skip
    return S3BlobStore(bucket, **{**args, **kw})


@pytest.fixture
def store(server: S3Server, bucket: str) -> S3BlobStore:
    return make_store(server, bucket)


def settled(store: S3BlobStore) -> S3BlobStore:
    """`store` after one upload: its client is the one it keeps (a server refusing streamed
    checksums has it rebuilt at the first), so hooks a test registers stay on it."""
    store.put(*blob(b"settled"))
    return store


# -- objects ------------------------------------------------------------------------------
def test_put_get_head_delete(store: S3BlobStore) -> None:
    digest, data = blob(os.urandom(3000))
    puts = count_calls(store, "PutObject")
    assert store.put(digest, data) is True
    assert store.put(digest, data) is False  # content addressing: HEAD, no second upload
    assert puts == ["PutObject"]
    assert store.exists(digest) and store.get(digest) == data
    with pytest.raises(OverLimit):
        store.get(digest, max_bytes=100)  # refused on ContentLength, before the download
    listed = store.client.list_objects_v2(Bucket=store.bucket)["Contents"]
    assert [o["Key"] for o in listed] == [f"team/cache/default/objects/{digest[:2]}/{digest}"]
    assert store.delete(digest) is True
    assert store.get(digest) is None and not store.exists(digest)
    assert store.delete(digest) is False


def test_missing_objects_and_records_are_misses(store: S3BlobStore) -> None:
    assert store.get("0" * 64) is None and store.exists("0" * 64) is False
    assert store.get_record(REMOVED, RECORD) is None
    assert store.get_identity() is None
    assert list(store.iter_blobs()) == [] and list(store.iter_records(REMOVED)) == []
    store.check()


def test_delete_many_batches_and_tolerates_missing(store: S3BlobStore) -> None:
    kept, data = blob(b"kept")
    store.put(kept, data)
    doomed = dict(blob(f"doomed {i}".encode()) for i in range(3))
    for digest, body in doomed.items():
        store.put(digest, body)
    missing = [hashlib.sha256(f"never stored {i}".encode()).hexdigest() for i in range(1500)]
    requests = count_calls(store, "DeleteObjects")
    store.delete_many([*doomed, *missing])
    assert len(requests) == 2  # 1000 keys a request; missing keys are no error
    assert [b.digest for b in store.iter_blobs()] == [kept]


def test_listing_pages_in_key_order(store: S3BlobStore) -> None:
    blobs = dict(blob(f"object {i}".encode()) for i in range(25))
    for digest, data in blobs.items():
        store.put(digest, data)
    pages = count_calls(store, "ListObjectsV2")
    store.client.meta.events.register(
        "before-parameter-build.s3.ListObjectsV2",
        lambda params, **_: params.__setitem__("MaxKeys", 10),
    )
    before = time.time()
    found = list(store.iter_blobs())
    assert len(pages) == 3  # 10 + 10 + 5, by continuation token
    assert [b.digest for b in found] == sorted(blobs)  # UTF-8 binary order of the keys
    assert [b.size for b in found] == [len(blobs[d]) for d in sorted(blobs)]
    assert all(abs(b.mtime - before) < 600 for b in found)  # LastModified, in UTC


def test_large_objects_go_multipart_and_quarantine_by_server_side_copy(
    server: S3Server, bucket: str
) -> None:
    store = settled(make_store(server, bucket, multipart=Multipart(5 * MiB, 5 * MiB),
                               timeout_secs=30))  # fmt: skip
    digest, data = blob(os.urandom(12 * MiB + 123))
    parts, copies = count_calls(store, "UploadPart"), count_calls(store, "UploadPartCopy")
    assert store.put(digest, data) is True
    assert len(parts) == 3
    head = store.client.head_object(Bucket=bucket, Key=store.key(digest))
    assert head["ETag"].strip('"').endswith("-3")  # a multipart object's ETag
    assert head["ContentLength"] == len(data) and store.get(digest) == data
    store.quarantine(digest)
    assert len(copies) == 3 and store.get(digest) is None
    assert [(q.digest, q.size) for q in store.iter_quarantined()] == [(digest, len(data))]


# -- create once: If-None-Match -------------------------------------------------------------
def test_create_once_refuses_an_existing_key(
    store: S3BlobStore, caplog: pytest.LogCaptureFixture
) -> None:
    assert store.put_identity(b'{"id": "first"}') is True
    assert store.put_identity(b'{"id": "second"}') is False
    assert store.get_identity() == b'{"id": "first"}'
    assert store.create_record(REMOVED, RECORD, b"one") is True
    assert store.create_record(REMOVED, RECORD, b"two") is False
    assert store.get_record(REMOVED, RECORD) == b"one"
    assert store._create_once.honoured is True  # confirmed on the first create
    assert "If-None-Match" not in caplog.text


def test_racing_first_writers_make_one_identity(server: S3Server, bucket: str) -> None:
    """Eight stores (as eight first writers' processes) create the identity at once."""
    stores = [make_store(server, bucket) for _ in range(8)]
    for one in stores:
        one.check()  # clients built before the start line
    start, won = threading.Barrier(len(stores)), []

    def create(i: int) -> None:
        start.wait()
        if stores[i].put_identity(f'{{"id": "{i}"}}'.encode()):
            won.append(i)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1, won
    assert stores[0].get_identity() == f'{{"id": "{won[0]}"}}'.encode()


def _ignoring_if_none_match(store: S3BlobStore) -> None:
    """The store's requests reach the server without If-None-Match, as a server that
    ignores the header treats them."""

    def strip(request: Any, **_: Any) -> None:
        del request.headers["If-None-Match"]

    store.client.meta.events.register("before-sign.s3.PutObject", strip)


def test_a_server_ignoring_if_none_match_is_said_once_and_makes_one_identity(
    server: S3Server, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = settled(make_store(server, bucket)), settled(make_store(server, bucket))
    for one in (first, second):
        _ignoring_if_none_match(one)
    with caplog.at_level(logging.WARNING, logger="artifactstore"):
        assert first.put_identity(b'{"id": "first"}') is True
        assert first._create_once.honoured is False
        assert second.put_identity(b'{"id": "second"}') is False  # looked first
        assert first.put_identity(b'{"id": "again"}') is False
        assert first.create_record(REMOVED, RECORD, b"one") is True
        assert first.create_record(REMOVED, RECORD, b"two") is False
    assert first.get_identity() == b'{"id": "first"}'
    assert first.get_record(REMOVED, RECORD) == b"one"
    said = [r.getMessage() for r in caplog.records if "If-None-Match" in r.getMessage()]
    assert len(said) == 1 and "does not honour If-None-Match: *" in said[0], said
    assert server.endpoint in said[0] and "\n" not in said[0]


def test_a_server_refusing_the_condition_is_said_once_and_looks_first(
    server: S3Server, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = settled(make_store(server, bucket))

    def refuse(params: dict[str, Any], **_: Any) -> None:
        if params.get("IfNoneMatch"):
            response = {"Error": {"Code": "NotImplemented"},
                        "ResponseMetadata": {"HTTPStatusCode": 501}}  # fmt: skip
            raise bce.ClientError(response, "PutObject")  # type: ignore[arg-type]

    store.client.meta.events.register("before-parameter-build.s3.PutObject", refuse)
    with caplog.at_level(logging.WARNING, logger="artifactstore"):
        assert store.create_record(REMOVED, RECORD, b"one") is True
        assert store.create_record(REMOVED, RECORD, b"two") is False
        assert store.put_identity(b'{"id": "x"}') is True
    assert store.get_record(REMOVED, RECORD) == b"one"
    said = [r.getMessage() for r in caplog.records if "If-None-Match" in r.getMessage()]
    assert len(said) == 1 and "answered NotImplemented" in said[0], said


# -- what the servers differ in ---------------------------------------------------------------
def test_an_archived_object_is_a_miss_for_it_alone_where_the_server_archives(
    server: S3Server, store: S3BlobStore
) -> None:
    kept, archived = blob(b"kept"), blob(b"archived")
    for digest, data in (kept, archived):
        store.put(digest, data)
    key = store.key(archived[0])
    source = {"Bucket": store.bucket, "Key": key}
    store.client.copy_object(Bucket=store.bucket, Key=key, CopySource=source,
                             StorageClass="GLACIER")  # fmt: skip
    assert store.client.head_object(Bucket=store.bucket, Key=key)["StorageClass"] == "GLACIER"
    if server.archives:
        with pytest.raises(ObjectUnreadable, match="InvalidObjectState"):
            store.get(archived[0])
    else:  # a storage class is a placement target: served as any other
        assert store.get(archived[0]) == archived[1]
    assert store.get(kept[0]) == kept[1]
    assert {b.digest for b in store.iter_blobs()} == {kept[0], archived[0]}


def test_an_object_the_policy_refuses_is_a_miss_for_it_alone(store: S3BlobStore) -> None:
    kept, refused = blob(b"kept"), blob(b"refused")
    for digest, data in (kept, refused):
        store.put(digest, data)
    statement = {"Effect": "Deny", "Principal": {"AWS": ["arn:aws:iam:::user/artstore"]},
                 "Action": ["s3:GetObject"],
                 "Resource": [f"arn:aws:s3:::{store.bucket}/{store.key(refused[0])}"]}  # fmt: skip
    policy = json.dumps({"Version": "2012-10-17", "Statement": [statement]})
    store.client.put_bucket_policy(Bucket=store.bucket, Policy=policy)
    with pytest.raises(ObjectUnreadable, match="a miss for that object only"):
        store.get(refused[0])  # 403, and the listing shows it: that object only
    assert store.get(kept[0]) == kept[1]
    assert store.get("0" * 64) is None  # a miss, on a policy that denies a key or not


@pytest.mark.rgw
def test_what_the_create_once_policy_condition_does_on_rgw(rgw_server: S3Server) -> None:
    """infra/policies/s3-writer.json denies a PutObject of a removal record that lacks
    If-None-Match (created once, never replaced by a bucket writer). AWS enforces that: a
    create passes, a replacement is refused. RGW 16.2 does not know the condition key, so
    the Deny matches every put, creates too, and a writer could remove no version at all:
    docs/operations.md says to leave the statement out there. (moto's answer depends on
    the client's checksum settings: not a server to measure this on.)"""
    client = rgw_server.client(plain=True)  # RGW refuses boto3's streamed checksums
    bucket = rgw_server.new_bucket()
    arn, removed = f"arn:aws:s3:::{bucket}", f"cache/default/keys/{uuid.uuid4().hex}.removed"
    statement = {"Effect": "Deny", "Principal": "*", "Action": ["s3:PutObject"],
                 "Resource": [f"{arn}/cache/default/keys/*.removed"],
                 "Condition": {"Null": {"s3:if-none-match": "true"}}}  # fmt: skip
    everything = {"Effect": "Allow", "Principal": "*", "Action": ["s3:*"],
                  "Resource": [arn, f"{arn}/*"]}  # fmt: skip
    policy = {"Version": "2012-10-17", "Statement": [everything, statement]}
    client.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))

    def put(**condition: str) -> str:
        try:
            client.put_object(Bucket=bucket, Key=removed, Body=b"r", **condition)
        except bce.ClientError as exc:
            return str(exc.response["Error"]["Code"])
        return "taken"

    create, replace = put(IfNoneMatch="*"), put()
    assert (create, replace) == ("AccessDenied", "AccessDenied")  # AWS: taken, AccessDenied
    client.delete_bucket_policy(Bucket=bucket)
    assert put(IfNoneMatch="*") == "taken"  # the policy refused it, nothing else


def test_a_wrong_secret_is_one_line_naming_it(
    server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-" + server.secret_key)
    store = make_store(server, bucket)
    if not server.checks_credentials:
        store.check()  # moto accepts any credentials (its IAM auth is off)
        return
    with pytest.raises(StoreUnavailable) as info:
        store.get("0" * 64)
    message = str(info.value)
    assert "credentials rejected" in message and "SignatureDoesNotMatch" in message
    assert "check AWS_SECRET_ACCESS_KEY" in message and "\n" not in message
    assert server.secret_key not in message


def test_a_clock_off_by_20_minutes_is_one_line_naming_it(
    server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host whose clock runs 20 minutes ahead signs every request with that time: AWS
    and RGW refuse them all (RequestTimeTooSkewed), so the store is down for this host,
    which compiles (the breaker's case), and the line names the clock, not the service."""
    store = make_store(server, bucket)
    digest, data = blob(b"put before the clock went wrong")
    assert store.put(digest, data) is True
    real = botocore.auth.get_current_datetime
    ahead = datetime.timedelta(minutes=20)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda **kw: real(**kw) + ahead)
    if not server.checks_credentials:
        assert store.get(digest) == data  # moto checks no signature, nor its time
        return
    with pytest.raises(StoreUnavailable) as info:
        store.get(digest)
    message = str(info.value)
    assert "refused this host's clock (RequestTimeTooSkewed)" in message, message
    assert "NTP" in message and "\n" not in message and server.secret_key not in message
    monkeypatch.setattr(botocore.auth, "get_current_datetime", real)
    assert store.get(digest) == data


def test_missing_bucket_is_one_line_naming_it(server: S3Server) -> None:
    store = make_store(server, f"no-such-{uuid.uuid4().hex[:8]}")
    with pytest.raises(StoreUnavailable, match="does not exist"):
        store.check()
    with pytest.raises(StoreUnavailable, match="NoSuchBucket"):
        store.put(*blob(b"into nothing"))


def test_checksum_headers(server: S3Server, bucket: str) -> None:
    """What a server does with a wrong checksum on upload (AWS refuses both). The store
    sends neither itself (boto3 adds a CRC32, which only AWS checks) and needs neither:
    the digest is checked on every read, so a corrupted upload is a miss, whichever the
    server, and `artstore verify` quarantines it."""
    client = server.client(plain=True)  # the checksum in a header, not streamed
    wrong = {
        "md5": ({"ContentMD5": base64.b64encode(b"\0" * 16).decode()}, server.verifies_md5),
        "crc": ({"ChecksumCRC32": "AAAAAA=="}, server.verifies_checksums),
    }
    for key, (header, verified) in wrong.items():
        try:
            client.put_object(Bucket=bucket, Key=key, Body=b"hello", **header)
        except bce.ClientError as exc:
            assert verified, f"{server.name} refused a wrong {key}: {exc}"
            assert exc.response["Error"]["Code"] in ("BadDigest", "InvalidDigest", "InvalidRequest")
        else:
            assert not verified, f"{server.name} accepted a wrong {key}"


def test_uploads_where_streamed_checksums_are_refused(
    server: S3Server, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    """boto3 1.36+ streams a CRC32 trailer with uploads over HTTPS; RGW 16.2 refuses every
    such PutObject and UploadPart (MissingContentLength): the store says so once and
    uploads without (objects, multipart parts, records and the identity alike)."""
    store = make_store(server, bucket, multipart=Multipart(5 * MiB, 5 * MiB),
                       timeout_secs=30)  # fmt: skip
    small, large = blob(os.urandom(3000)), blob(os.urandom(11 * MiB))
    with caplog.at_level(logging.WARNING, logger="artifactstore"):
        for digest, data in (small, large):
            assert store.put(digest, data) is True
        assert store.put_identity(b'{"id": "x"}') is True
        assert store.create_record(REMOVED, RECORD, b"one") is True
    assert store.get(small[0]) == small[1] and store.get(large[0]) == large[1]
    said = [r.getMessage() for r in caplog.records if "streamed" in r.getMessage()]
    assert store.uploads.plain is (not server.takes_streamed_checksums)
    assert len(said) == (0 if server.takes_streamed_checksums else 1), said
