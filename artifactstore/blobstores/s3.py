"""Objects in an S3 (or S3-compatible: MinIO, Ceph RGW, moto) bucket, through boto3.

Credentials come only from boto3's standard chain (environment, AWS_PROFILE,
instance/IRSA roles), so no secret ever passes through our settings, logs or
messages. The endpoint comes from the `endpoint_url` argument, else from
boto3's own AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL handling.

Layout inside the bucket (one namespace per team/project)::

    {prefix}/{namespace}/objects/{digest[:2]}/{digest}
    {prefix}/{namespace}/quarantine/{digest}
    {prefix}/{namespace}/keys/{key}          manifests (artifactstore.formats.manifest)
    {prefix}/{namespace}/journals/{name}     hit journals (artifactstore.formats.journal)
    {prefix}/{namespace}/leases/{key}        compile leases' mirrors (artifactstore.store.flight)
    {prefix}/{namespace}/quick/{fp}.{key}    keys too quick to store (artifactstore.formats.quick)
    {prefix}/{namespace}/identity            the store's id (artifactstore.store.identity)

S3 makes an object visible only once its upload (single or multipart) has
completed, so readers never see partial bytes and no temp-file dance is needed.
Every botocore failure except "not found" becomes `StoreUnavailable` with one
line that names the bucket, the problem and the fix, so callers can degrade to
a compile (invariant 2) without leaking credentials (invariant 5): the lines are
`s3errors.py`, the client and its bounded retries `s3client.py`.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NoReturn

from boto3.s3.transfer import TransferConfig

from artifactstore.blobstores.base import (
    IDENTITY,
    BlobInfo,
    BlobStore,
    RecordKind,
    is_digest_name,
)
from artifactstore.blobstores.s3client import Uploads, credential_source, make_client
from artifactstore.blobstores.s3create import CreateOnce
from artifactstore.blobstores.s3errors import (
    DENIED,
    NOT_FOUND,
    Bucket,
    about_one_object,
    error_code,
    is_backend_error,
    message,
    object_message,
)
from artifactstore.config import check_namespace
from artifactstore.errors import ObjectUnreadable, OverLimit, StoreUnavailable
from artifactstore.formats.codec import check_digest
from artifactstore.formats.identity import MAX_IDENTITY_BYTES
from artifactstore.redact import redact

MiB = 1024 * 1024
DELETE_BATCH = 1000  # keys per DeleteObjects request (the API's limit)


@dataclass(frozen=True)
class Multipart:
    """When an upload goes in parts: below `threshold` one PUT is cheapest; above it the
    parts (`chunksize` each) upload in parallel and a failed part is retried alone,
    not the whole executable."""

    threshold: int = 64 * MiB
    chunksize: int = 16 * MiB


class S3BlobStore(BlobStore):
    """Content-addressed objects under one bucket prefix and namespace."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        namespace: str,
        endpoint_url: str | None,
        timeout_secs: float,
        *,
        multipart: Multipart = Multipart(),
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.namespace = check_namespace(namespace)  # a key prefix of its own
        self.endpoint_url = endpoint_url
        self.timeout_secs = timeout_secs
        self.base = f"{self.prefix}/{namespace}" if self.prefix else namespace
        self.objects_prefix = f"{self.base}/objects/"
        self.quarantine_prefix = f"{self.base}/quarantine/"
        self.transfer_config = TransferConfig(
            multipart_threshold=multipart.threshold,
            multipart_chunksize=multipart.chunksize,
            max_concurrency=4,
        )
        # The same transfer on the calling thread: from Python 3.12 on, an exit
        # flush may not start the threads s3transfer's pool needs.
        self.serial_config = TransferConfig(
            multipart_threshold=multipart.threshold,
            multipart_chunksize=multipart.chunksize,
            use_threads=False,
        )
        self._client: Any = None
        self._lock = threading.Lock()
        self.uploads = Uploads(self._endpoint)  # what the server takes of boto3's checksums
        self._create_once = CreateOnce(self._endpoint)  # what the server does with If-None-Match

    # -- client ---------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The boto3 client, built on first use (building it costs ~100 ms, no I/O)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make_client()
        return self._client

    def _make_client(self) -> Any:
        plain = self.uploads.plain
        return make_client(self.bucket, self.endpoint_url, self.timeout_secs, plain_uploads=plain)

    def _sending(self, upload: Callable[[], object]) -> None:
        self.uploads.send(upload, self._drop_client)

    def _drop_client(self) -> None:
        with self._lock:
            self._client = None  # the next call builds one as `uploads` now says

    def _endpoint(self) -> str:
        try:
            endpoint = str(self.client.meta.endpoint_url)
        except StoreUnavailable:
            endpoint = self.endpoint_url or "the default AWS endpoint"
        return redact(endpoint)

    # -- keys -----------------------------------------------------------------

    def key(self, digest: str) -> str:
        check_digest(digest)
        return f"{self.objects_prefix}{digest[:2]}/{digest}"

    def quarantine_key(self, digest: str) -> str:
        check_digest(digest)
        return f"{self.quarantine_prefix}{digest}"

    # -- BlobStore ------------------------------------------------------------

    def get(self, digest: str, *, max_bytes: int | None = None) -> bytes | None:
        key = self.key(digest)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
            size = int(response.get("ContentLength") or 0)
            if max_bytes is not None and size > max_bytes:  # refused before the download
                response["Body"].close()
                raise OverLimit(
                    f"object {digest[:12]} is {size} bytes, over this reader's limit "
                    f"of {max_bytes} (ARTSTORE_MAX_OBJECT_SIZE)"
                )
            body: bytes = response["Body"].read()
            return body
        except Exception as exc:
            if error_code(exc) in NOT_FOUND or self._denied_but_absent(key, exc):
                return None
            self._fail("get", exc, key)

    def exists(self, digest: str) -> bool:
        return self._head(self.key(digest))

    def put(self, digest: str, data: bytes) -> bool:
        key = self.key(digest)
        # Content addressing: an existing object already holds these bytes, so
        # skip re-uploading hundreds of MB (and keep its LastModified for GC grace).
        if self._head(key):
            return False
        try:
            try:
                self._upload(key, data, self.transfer_config)
            except RuntimeError as exc:  # "can't create new thread at interpreter shutdown"
                if "thread" not in str(exc):
                    raise
                self._upload(key, data, self.serial_config)
        except Exception as exc:
            self._fail("put", exc)
        return True

    def _upload(self, key: str, data: bytes, config: TransferConfig) -> None:
        self._sending(lambda: self._upload_once(key, data, config))

    def _upload_once(self, key: str, data: bytes, config: TransferConfig) -> None:
        if len(data) < config.multipart_threshold:
            # One PUT on this thread: s3transfer would run it on a pool thread, which the
            # interpreter joins at exit, so a hung upload would outlast the exit flush.
            self.client.put_object(
                Bucket=self.bucket, Key=key, Body=data, ContentType="application/octet-stream"
            )
            return
        self.client.upload_fileobj(
            io.BytesIO(data),
            self.bucket,
            key,
            ExtraArgs={"ContentType": "application/octet-stream"},
            Config=config,
        )

    def delete(self, digest: str) -> bool:
        key = self.key(digest)
        # DeleteObject answers 204 whether or not the key existed; ask first.
        if not self._head(key):
            return False
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            self._fail("delete", exc)
        return True

    def delete_many(self, digests: Sequence[str]) -> None:
        self._delete_keys([self.key(d) for d in digests], "objects", super().delete_many)

    def _delete_keys(
        self, keys: list[str], what: str, one_by_one: Callable[[Sequence[str]], None]
    ) -> None:
        """DeleteObjects, 1000 keys a request, instead of a HEAD and a DELETE per key;
        `one_by_one(names)` for stores without the batch call."""
        for start in range(0, len(keys), DELETE_BATCH):
            chunk = keys[start : start + DELETE_BATCH]
            try:
                answer = self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
                )
            except Exception as exc:
                if error_code(exc) == "NotImplemented":
                    one_by_one([k.rsplit("/", 1)[-1] for k in chunk])
                    continue
                self._fail("delete", exc)
            errors = answer.get("Errors") or []
            if errors:
                first = errors[0]
                raise StoreUnavailable(
                    f"S3 bucket '{self.bucket}' refused to delete {len(errors)} {what} "
                    f"({first.get('Code', 'error')}: {first.get('Message', '')}): "
                    "check that the credentials may s3:DeleteObject"
                )

    # -- records: manifests and journals ----------------------------------------
    def record_key(self, kind: RecordKind, name: str) -> str:
        return f"{self.base}/{kind.folder}/{kind.check_name(name)}"

    def get_record(self, kind: RecordKind, name: str) -> bytes | None:
        key = self.record_key(kind, name)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
            body: bytes = response["Body"].read(kind.max_bytes + 1)  # more: refused by decode
            response["Body"].close()
            return body
        except Exception as exc:
            if error_code(exc) in NOT_FOUND or self._denied_but_absent(key, exc):
                return None
            self._fail(f"get {kind.name}", exc, key)

    def put_record(self, kind: RecordKind, name: str, data: bytes) -> None:
        try:
            self._put_json(self.record_key(kind, name), data)
        except Exception as exc:
            self._fail(f"put {kind.name}", exc)

    def _put_json(self, key: str, data: bytes, **condition: str) -> None:
        body = {"Bucket": self.bucket, "Key": key, "Body": data, "ContentType": "application/json"}
        self._sending(lambda: self.client.put_object(**body, **condition))

    def create_record(self, kind: RecordKind, name: str, data: bytes) -> bool:
        # If-None-Match: the writer policy denies any other put of a removal record.
        key = self.record_key(kind, name)
        try:
            return self._create_once.create(
                partial(self._put_json, key, data), partial(self.get_record, kind, name), data
            )
        except Exception as exc:
            self._fail(f"put {kind.name}", exc)

    def delete_records(self, kind: RecordKind, names: Sequence[str]) -> None:
        def one_by_one(names: Sequence[str]) -> None:
            for name in names:
                try:
                    self.client.delete_object(Bucket=self.bucket, Key=self.record_key(kind, name))
                except Exception as exc:
                    self._fail(f"delete {kind.name}", exc)

        keys = [self.record_key(kind, n) for n in names]
        self._delete_keys(keys, f"{kind.name}s", one_by_one)

    def iter_records(self, kind: RecordKind, *, prefix: str = "") -> Iterator[str]:
        return (info.digest for info in self._records(kind, prefix))

    def list_records(self, kind: RecordKind) -> Iterator[BlobInfo]:
        return self._records(kind, "")

    def _records(self, kind: RecordKind, prefix: str) -> Iterator[BlobInfo]:
        listed = f"{self.base}/{kind.folder}/{prefix}"
        return self._list(listed, f"list {kind.name}s", kind.listed)

    def get_identity(self) -> bytes | None:
        key = f"{self.base}/{IDENTITY}"
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
            body: bytes = response["Body"].read(MAX_IDENTITY_BYTES + 1)
            response["Body"].close()
            return body
        except Exception as exc:
            if error_code(exc) in NOT_FOUND or self._denied_but_absent(key, exc):
                return None
            self._fail("get identity", exc)

    def put_identity(self, data: bytes) -> bool:
        # Created only where none is; on a server without conditional writes, look then
        # write (a narrow race between two first writers, which the index then settles).
        put = partial(self._put_json, f"{self.base}/{IDENTITY}", data)
        try:
            return self._create_once.create(put, self.get_identity, data)
        except Exception as exc:
            self._fail("put identity", exc)

    def delete_identity(self) -> None:
        try:  # the operator's role may (s3-gc.json); a writer's may only create one
            self.client.delete_object(Bucket=self.bucket, Key=f"{self.base}/{IDENTITY}")
        except Exception as exc:
            self._fail("delete identity", exc)

    def quarantine(self, digest: str) -> None:
        source = self.key(digest)
        target = self.quarantine_key(digest)
        try:
            # Managed copy: server-side, multipart above the threshold (no 5 GiB limit).
            self.client.copy(
                {"Bucket": self.bucket, "Key": source},
                self.bucket,
                target,
                Config=self.transfer_config,
            )
        except Exception as exc:
            if error_code(exc) in NOT_FOUND:
                return  # already gone: nothing to serve, nothing to keep
            self._fail("quarantine", exc)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=source)
        except Exception as exc:
            self._fail("quarantine", exc)

    def iter_blobs(self) -> Iterator[BlobInfo]:
        return self._list(self.objects_prefix, "list")

    def iter_quarantined(self) -> Iterator[BlobInfo]:
        return self._list(self.quarantine_prefix, "list quarantine")

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.base}"

    def check(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            # HEAD has no body, so a missing bucket shows up only as a bare 404.
            if error_code(exc) in {"404", "NotFound", "NoSuchBucket"}:
                raise StoreUnavailable(
                    f"S3 bucket '{self.bucket}' does not exist at {self._endpoint()}: "
                    "create it or fix ARTSTORE_URL"
                ) from None
            if error_code(exc) not in DENIED:
                self._fail("check", exc)
            # Per-namespace policies (infra/policies/) allow ListBucket only under the
            # namespace's prefix, and HeadBucket needs an unconditioned ListBucket: a
            # listing of our own prefix proves the same bucket, credentials and access.
            try:
                self.client.list_objects_v2(
                    Bucket=self.bucket, Prefix=self.objects_prefix, MaxKeys=1
                )
            except Exception as again:
                self._fail("check", again)

    # -- helpers --------------------------------------------------------------

    def _head(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
            return True
        except Exception as exc:
            if error_code(exc) in NOT_FOUND or self._denied_but_absent(key, exc):
                return False
            self._fail("head", exc, key)

    def _denied_but_absent(self, key: str, exc: BaseException) -> bool:
        """Whether a 403 for `key` only means that it does not exist.

        S3 answers a missing key with 404 only to credentials allowed to list the
        bucket, and per-namespace policies allow listing under their prefix only,
        so a miss may arrive as 403. One listing of exactly that key tells a miss
        (True) from a real denial (False: the caller reports it)."""
        if error_code(exc) not in DENIED:
            return False
        try:
            found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1)
        except Exception:
            return False  # the prefix is denied too: the caller reports it
        if any(item.get("Key") == key for item in found.get("Contents", ())):
            # Listed but not readable: that one object (its ACL, its KMS key), not the store.
            raise ObjectUnreadable(object_message("get", key, exc, bucket=self.bucket))
        return True

    def _list(
        self, prefix: str, op: str, ours: Callable[[str], bool] = is_digest_name
    ) -> Iterator[BlobInfo]:
        """Objects under `prefix` whose names are `ours` (records: their kind's names,
        RecordKind.listed; records' `digest` is their name)."""
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", ()):
                    name = str(item["Key"]).rsplit("/", 1)[-1]
                    if not ours(name):
                        continue  # not ours (a stray upload or a marker)
                    yield BlobInfo(name, int(item["Size"]), item["LastModified"].timestamp())
        except StoreUnavailable:
            raise
        except Exception as exc:
            self._fail(op, exc)

    def _fail(self, op: str, exc: BaseException, key: str = "") -> NoReturn:
        """Re-raise a backend failure as one secret-free line naming the fix; S3's answer
        about the one object `key` as ObjectUnreadable (a miss for it, not an outage)."""
        if not is_backend_error(exc):
            raise exc
        if key and about_one_object(exc):
            raise ObjectUnreadable(object_message(op, key, exc, bucket=self.bucket)) from None
        raise StoreUnavailable(self._message(op, exc)) from None

    def _message(self, op: str, exc: BaseException) -> str:
        at = Bucket(self.bucket, self.base, self.timeout_secs, self._endpoint, credential_source)
        return message(op, exc, at)
