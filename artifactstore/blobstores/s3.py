"""Objects in an S3 (or S3-compatible: MinIO, moto) bucket, through boto3.

Credentials come only from boto3's standard chain (environment, AWS_PROFILE,
instance/IRSA roles), so no secret ever passes through our settings, logs or
messages. The endpoint comes from the `endpoint_url` argument, else from
boto3's own AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL handling.

Layout inside the bucket (one namespace per team/project)::

    {prefix}/{namespace}/objects/{digest[:2]}/{digest}
    {prefix}/{namespace}/quarantine/{digest}
    {prefix}/{namespace}/keys/{key}          manifests (artifactstore.formats.manifest)
    {prefix}/{namespace}/journals/{name}     hit journals (artifactstore.formats.journal)
    {prefix}/{namespace}/identity            the store's id (artifactstore.store.identity)

S3 makes an object visible only once its upload (single or multipart) has
completed, so readers never see partial bytes and no temp-file dance is needed.
Every botocore failure except "not found" becomes `StoreUnavailable` with one
line that names the bucket, the problem and the fix, so callers can degrade to
a compile (invariant 2) without leaking credentials (invariant 5).
"""

from __future__ import annotations

import io
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import boto3
import botocore.exceptions as bce
from boto3.exceptions import Boto3Error
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from artifactstore.blobstores.base import (
    IDENTITY,
    MAX_IDENTITY_BYTES,
    BlobInfo,
    BlobStore,
    RecordKind,
    check_digest,
)
from artifactstore.config import check_namespace
from artifactstore.errors import OverLimit, StoreUnavailable
from artifactstore.redact import redact

MiB = 1024 * 1024
# Below this a single PUT is cheapest; above it multipart uploads parts in
# parallel and retries a failed part instead of the whole executable.
DEFAULT_MULTIPART_THRESHOLD = 64 * MiB
DEFAULT_MULTIPART_CHUNKSIZE = 16 * MiB
# Few attempts: a store that is down must degrade to a compile quickly. ARTSTORE_TIMEOUT
# bounds a whole call, retries included (see `call_budget`), so each attempt gets a
# share of it, and a bound too short for MAX_ATTEMPTS shares of MIN_ATTEMPT_SECS gets
# fewer attempts rather than shares too short to answer in.
MAX_ATTEMPTS = 3
MIN_ATTEMPT_SECS = 2.0
MAX_CONNECT_SECS = 2.0  # a TCP + TLS connect takes milliseconds; the rest of a share reads
# Transient S3 answers, retried within the bound (as botocore's standard mode does).
_RETRY_STATUS = {500, 502, 503, 504}
_RETRY_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                "RequestTimeoutException", "InternalError", "ServiceUnavailable"}  # fmt: skip
DELETE_BATCH = 1000  # keys per DeleteObjects request (the API's limit)

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_BAD_CREDENTIALS = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "InvalidClientTokenId",
    "AuthorizationHeaderMalformed",
}
_DENIED = {"AccessDenied", "403", "Forbidden", "AllAccessDisabled"}
_NO_BUCKET = {"NoSuchBucket"}


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
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        multipart_chunksize: int = DEFAULT_MULTIPART_CHUNKSIZE,
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
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            max_concurrency=4,
        )
        # The same transfer on the calling thread: from Python 3.12 on, an exit
        # flush may not start the threads s3transfer's pool needs.
        self.serial_config = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            use_threads=False,
        )
        self._client: Any = None
        self._lock = threading.Lock()

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
        session = boto3.session.Session()
        # Explicit endpoint, else whatever boto3 resolves from AWS_ENDPOINT_URL_S3 /
        # AWS_ENDPOINT_URL / its config file. Custom endpoints (MinIO, moto) rarely
        # have wildcard DNS for virtual-hosted buckets, so use path-style there.
        custom = self.endpoint_url is not None or _configured_endpoint(session) is not None
        budget = call_budget(self.timeout_secs)
        config = Config(
            connect_timeout=budget.connect_secs,
            read_timeout=budget.read_secs,
            # botocore's own retries are off: `_Retries` retries within the bound.
            retries={"total_max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": "path"} if custom else None,
            max_pool_connections=16,
        )
        try:
            client = session.client("s3", endpoint_url=self.endpoint_url, config=config)
            retries = _Retries(budget)
            client.meta.events.register("before-call.s3", retries.start)
            client.meta.events.register_first("needs-retry.s3", retries.needs_retry)
            return client
        except (bce.BotoCoreError, ValueError) as exc:
            raise StoreUnavailable(
                f"cannot set up S3 client for bucket '{self.bucket}' "
                f"({type(exc).__name__}): check AWS_DEFAULT_REGION, AWS_PROFILE and "
                "AWS_ENDPOINT_URL_S3 / ARTSTORE_S3_ENDPOINT_URL"
            ) from None

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
            if _code(exc) in _NOT_FOUND or self._denied_but_absent(key, exc):
                return None
            self._fail("get", exc)

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
                if _code(exc) == "NotImplemented":
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
            if _code(exc) in _NOT_FOUND or self._denied_but_absent(key, exc):
                return None
            self._fail(f"get {kind.name}", exc)

    def put_record(self, kind: RecordKind, name: str, data: bytes) -> None:
        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=self.record_key(kind, name),
                Body=data,
                ContentType="application/json",
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

    def iter_records(self, kind: RecordKind) -> Iterator[str]:
        listing = self._list(f"{self.base}/{kind.folder}/", f"list {kind.name}s", 0)
        return (info.digest for info in listing)

    def get_identity(self) -> bytes | None:
        key = f"{self.base}/{IDENTITY}"
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
            body: bytes = response["Body"].read(MAX_IDENTITY_BYTES + 1)
            response["Body"].close()
            return body
        except Exception as exc:
            if _code(exc) in _NOT_FOUND or self._denied_but_absent(key, exc):
                return None
            self._fail("get identity", exc)

    def put_identity(self, data: bytes) -> bool:
        key = f"{self.base}/{IDENTITY}"
        put = {"Bucket": self.bucket, "Key": key, "Body": data, "ContentType": "application/json"}
        try:
            self.client.put_object(**put, IfNoneMatch="*")  # created only where none is
            return True
        except Exception as exc:
            if _code(exc) in {"PreconditionFailed", "412", "ConditionalRequestConflict"}:
                return False
            if _code(exc) not in {"NotImplemented", "InvalidArgument"}:
                self._fail("put identity", exc)
        # A store without conditional writes: look, then write (a narrow race between
        # two first writers, which the index's one row per namespace then settles).
        if self._head(key):
            return False
        try:
            self.client.put_object(**put)
        except Exception as exc:
            self._fail("put identity", exc)
        return True

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
            if _code(exc) in _NOT_FOUND:
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
            if _code(exc) in {"404", "NotFound", "NoSuchBucket"}:
                raise StoreUnavailable(
                    f"S3 bucket '{self.bucket}' does not exist at {self._endpoint()}: "
                    "create it or fix ARTSTORE_URL"
                ) from None
            if _code(exc) not in _DENIED:
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
            if _code(exc) in _NOT_FOUND or self._denied_but_absent(key, exc):
                return False
            self._fail("head", exc)

    def _denied_but_absent(self, key: str, exc: BaseException) -> bool:
        """Whether a 403 for `key` only means that it does not exist.

        S3 answers a missing key with 404 only to credentials allowed to list the
        bucket, and per-namespace policies allow listing under their prefix only,
        so a miss may arrive as 403. One listing of exactly that key tells a miss
        (True) from a real denial (False: the caller reports it)."""
        if _code(exc) not in _DENIED:
            return False
        try:
            found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1)
        except Exception:
            return False
        return not any(item.get("Key") == key for item in found.get("Contents", ()))

    def _list(self, prefix: str, op: str, length: int = 64) -> Iterator[BlobInfo]:
        """Objects under `prefix` whose names are `length` long (0: any our own name;
        records' `digest` is their name)."""
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", ()):
                    name = str(item["Key"]).rsplit("/", 1)[-1]
                    if (len(name) != length) if length else not name.isalnum():
                        continue  # not ours (a stray upload or a marker)
                    yield BlobInfo(name, int(item["Size"]), item["LastModified"].timestamp())
        except StoreUnavailable:
            raise
        except Exception as exc:
            self._fail(op, exc)

    def _fail(self, op: str, exc: BaseException) -> NoReturn:
        """Re-raise a backend failure as one secret-free line naming the fix."""
        if not isinstance(exc, (bce.BotoCoreError, bce.ClientError, Boto3Error)):
            raise exc
        raise StoreUnavailable(self._message(op, exc)) from None

    def _message(self, op: str, exc: BaseException) -> str:
        bucket = f"'{self.bucket}'"
        kind = type(exc).__name__
        if isinstance(exc, (bce.EndpointConnectionError, bce.ProxyConnectionError)):
            return (
                f"S3 bucket {bucket} not reachable at {self._endpoint()} ({kind}): "
                "check ARTSTORE_URL / AWS_ENDPOINT_URL_S3 and the network"
            )
        if isinstance(exc, (bce.ConnectTimeoutError, bce.ReadTimeoutError)):
            return (
                f"S3 bucket {bucket} at {self._endpoint()} did not answer within "
                f"{self.timeout_secs:g} s during {op} ({kind}): check the network "
                "or raise ARTSTORE_TIMEOUT"
            )
        if isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError)):
            return (
                f"no usable S3 credentials for bucket {bucket} ({kind}): set AWS_PROFILE "
                "or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or use an instance role)"
            )
        if isinstance(exc, bce.NoRegionError):
            return f"no AWS region configured for bucket {bucket} ({kind}): set AWS_DEFAULT_REGION"
        code = _code(exc)
        if code in _BAD_CREDENTIALS:
            return (
                f"S3 credentials rejected for bucket {bucket} ({code}): "
                "check AWS_ACCESS_KEY_ID/AWS_PROFILE"
            )
        if code in _NO_BUCKET:
            return (
                f"S3 bucket {bucket} does not exist at {self._endpoint()} ({code}): "
                "create it or fix ARTSTORE_URL"
            )
        if code in _DENIED:
            return (
                f"S3 access denied for {op} in bucket {bucket} under '{self.base}/' ({code}): "
                "check the IAM policy for these credentials (see infra/policies/)"
            )
        detail = code or kind
        return (
            f"S3 {op} failed for bucket {bucket} at {self._endpoint()} ({detail}): "
            "check the S3 service and ARTSTORE_URL"
        )


@dataclass(frozen=True)
class CallBudget:
    """How one S3 call spends ARTSTORE_TIMEOUT: `attempts` tries of at most
    `connect_secs` + `read_secs` each, so that attempts x (connect + read) <= the bound."""

    bound_secs: float
    attempts: int
    connect_secs: float
    read_secs: float

    @property
    def attempt_secs(self) -> float:
        return self.connect_secs + self.read_secs


def call_budget(bound_secs: float) -> CallBudget:
    """Split the bound on one call (connect + read, retries included) into attempts.

    T = 10 s (the default): 3 attempts of 1.1 s connect + 2.2 s read; T = 2 s: one
    attempt of 0.7 + 1.3 s. The read timeout is botocore's per socket read, so a large
    transfer that keeps moving is never cut; a server that stops answering is.
    """
    attempts = max(1, min(MAX_ATTEMPTS, int(bound_secs // MIN_ATTEMPT_SECS)))
    share = bound_secs / attempts
    connect = min(share / 3, MAX_CONNECT_SECS)
    return CallBudget(bound_secs, attempts, connect, share - connect)


class _Retries:
    """botocore's `needs-retry` hook: retry transient failures (connection errors,
    timeouts, 5xx, throttling) while another whole attempt fits before the call's
    deadline, with a short jittered back-off; never past the bound."""

    def __init__(self, budget: CallBudget) -> None:
        self.budget = budget

    def start(self, context: dict[str, Any], **_: Any) -> None:
        context["artstore_deadline"] = time.monotonic() + self.budget.bound_secs

    def needs_retry(
        self,
        attempts: int,
        request_dict: dict[str, Any] | None = None,
        response: Any = None,
        caught_exception: BaseException | None = None,
        **_: Any,
    ) -> float | None:
        if attempts >= self.budget.attempts or not _transient(response, caught_exception):
            return None
        deadline = ((request_dict or {}).get("context") or {}).get("artstore_deadline")
        delay = random.uniform(0, min(0.05 * 2**attempts, 0.5))
        if deadline is None or time.monotonic() + delay + self.budget.attempt_secs > deadline:
            return None
        return delay


def _transient(response: Any, caught: BaseException | None) -> bool:
    if caught is not None:
        return isinstance(caught, (bce.ConnectionError, bce.HTTPClientError))
    if not response:
        return False
    http, parsed = response
    code = str((parsed or {}).get("Error", {}).get("Code", ""))
    return getattr(http, "status_code", 0) in _RETRY_STATUS or code in _RETRY_CODES


def _code(exc: BaseException) -> str:
    """The S3 error code of a ClientError (or of a boto3 wrapper around one)."""
    if isinstance(exc, bce.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    if isinstance(exc, Boto3Error):  # e.g. S3UploadFailedError keeps only the text
        match = re.search(r"An error occurred \(([A-Za-z0-9]+)\)", str(exc))
        return match.group(1) if match else ""
    return ""


def _configured_endpoint(session: Any) -> str | None:
    """The endpoint boto3 would use from env/config, if any (for addressing style)."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(name):
            return os.environ[name]
    try:
        scoped = session._session.get_scoped_config()
    except Exception:
        return None
    value = scoped.get("endpoint_url") if isinstance(scoped, dict) else None
    return str(value) if value else None
