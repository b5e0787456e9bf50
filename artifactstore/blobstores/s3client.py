"""The boto3 client of an S3 store, and how one call spends ARTSTORE_TIMEOUT.

A store that is down must degrade to a compile quickly, so every call (retries
included) is bounded by ARTSTORE_TIMEOUT: botocore's own retries are off, and
`_Retries` retries transient failures only while another whole attempt fits.
Apart from `s3.py` so that the bucket's layout and calls read on their own.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.exceptions as bce
from botocore.config import Config

from artifactstore.blobstores.s3errors import error_code
from artifactstore.errors import StoreUnavailable

log = logging.getLogger("artifactstore")

# Few attempts: a store that is down must degrade to a compile quickly. ARTSTORE_TIMEOUT
# bounds a whole call, retries included (see `call_budget`), so each attempt gets a
# share of it, and a bound too short for MAX_ATTEMPTS shares of MIN_ATTEMPT_SECS gets
# fewer attempts rather than shares too short to answer in.
MAX_ATTEMPTS = 3
MIN_ATTEMPT_SECS = 2.0
MAX_CONNECT_SECS = 2.0  # a TCP + TLS connect takes milliseconds; the rest of a share reads
# Transient S3 answers, retried within the bound (as botocore's standard mode does).
_RETRY_STATUS = {500, 502, 503, 504}
_RETRY_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalError",
    "ServiceUnavailable",
}


# Answers of a server that does not take boto3's (1.36+) uploads with a streaming checksum
# trailer (`aws-chunked`, sent over HTTPS): measured on Ceph RGW 16.2, every PutObject and
# UploadPart. The store then uploads without them (`plain_uploads`): see S3BlobStore._sending.
STREAMING_REFUSED = {"MissingContentLength"}


def make_client(
    bucket: str, endpoint_url: str | None, timeout_secs: float, *, plain_uploads: bool = False
) -> Any:
    """A boto3 S3 client whose calls are bounded by `timeout_secs`; StoreUnavailable
    (one line naming the fix) when boto3 cannot set one up. `plain_uploads`: checksums
    only where an operation requires one (botocore's `when_required`), none streamed."""
    session = boto3.session.Session()
    # Explicit endpoint, else whatever boto3 resolves from AWS_ENDPOINT_URL_S3 /
    # AWS_ENDPOINT_URL / its config file. Custom endpoints (MinIO, moto) rarely
    # have wildcard DNS for virtual-hosted buckets, so use path-style there.
    custom = endpoint_url is not None or _configured_endpoint(session) is not None
    budget = call_budget(timeout_secs)
    config = Config(
        connect_timeout=budget.connect_secs,
        read_timeout=budget.read_secs,
        # botocore's own retries are off: `_Retries` retries within the bound.
        retries={"total_max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": "path"} if custom else None,
        max_pool_connections=16,
        **_checksums(plain_uploads),
    )
    try:
        client = session.client("s3", endpoint_url=endpoint_url, config=config)
        retries = _Retries(budget)
        client.meta.events.register("before-call.s3", retries.start)
        client.meta.events.register_first("needs-retry.s3", retries.needs_retry)
        return client
    except (bce.BotoCoreError, ValueError) as exc:
        raise StoreUnavailable(
            f"cannot set up S3 client for bucket '{bucket}' "
            f"({type(exc).__name__}): check AWS_DEFAULT_REGION, AWS_PROFILE and "
            "AWS_ENDPOINT_URL_S3 / ARTSTORE_S3_ENDPOINT_URL"
        ) from None


def _checksums(plain: bool) -> dict[str, str]:
    """botocore's setting for uploads without streamed checksums (older botocore, before
    1.36, has no such setting and streams none)."""
    if plain and "request_checksum_calculation" in Config.OPTION_DEFAULTS:
        return {"request_checksum_calculation": "when_required"}
    return {}


class Uploads:
    """What one store's server takes of boto3's upload checksums: `plain` once it refused
    them streamed (STREAMING_REFUSED), said once in one line; its client is then rebuilt
    with `plain_uploads`. Nothing is lost: the store checks the digest on every read."""

    def __init__(self, endpoint: Callable[[], str]) -> None:
        self.endpoint = endpoint
        self.plain = False

    def send(self, upload: Callable[[], object], rebuild: Callable[[], None]) -> None:
        """`upload()`; where the server refuses its streamed checksum, once more on a
        client without (`rebuild()` drops the store's client)."""
        try:
            upload()
            return
        except Exception as exc:
            if self.plain or error_code(exc) not in STREAMING_REFUSED:
                raise
        if not self.plain:
            self.plain = True
            log.warning(
                "artifactstore: S3 at %s refused boto3's streamed upload checksums "
                "(MissingContentLength): uploading without them; the digest is still "
                "checked on every read (docs/operations.md, 'S3 servers')",
                self.endpoint(),
            )
        rebuild()
        upload()


def credential_source() -> tuple[str, str | None]:
    """Where boto3's chain finds this process's credentials (its provider's `method`:
    env, shared-credentials-file, iam-role, ...) and the profile, for the line of a
    rejection; asked only then (the chain is resolved again, as `make_client` did)."""
    try:
        session = boto3.session.Session()
        found = session.get_credentials()
        method = str(getattr(found, "method", "") or "") if found is not None else ""
        return method, session.profile_name
    except Exception:  # a line that names the variables still helps
        return "", None


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
    deadline, with a short jittered back-off; never past the bound.

    A connect that timed out spent only `connect_secs` of its share: a server whose
    accept queue is full drops SYNs (hundreds of readers starting at once), so those
    are retried for as long as an attempt fits, not `attempts` times; otherwise a
    raised ARTSTORE_TIMEOUT would give up after 3 x 2 s and say it waited the bound."""

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
        if not _transient(response, caught_exception):
            return None
        connect = isinstance(caught_exception, bce.ConnectTimeoutError)
        if attempts >= self.budget.attempts and not connect:
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
