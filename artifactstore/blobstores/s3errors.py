"""What an S3 failure means, in one secret-free line that names the fix.

Every botocore failure except "not found" becomes `StoreUnavailable`, so callers
degrade to a compile (invariant 2) without leaking credentials (invariant 5). An answer
about one object (`about_one_object`: archived, a conflict, a failed precondition or
range, a checksum mismatch) is `ObjectUnreadable`: a miss for that object, not an
outage, since anyone who may write the bucket can put such an object and must not
switch a reader's store off. Only transport failures, timeouts, 5xx, throttling and
denials of the whole prefix count toward a breaker.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import botocore.exceptions as bce
from boto3.exceptions import Boto3Error

NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
BAD_CREDENTIALS = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "InvalidClientTokenId",
    "AuthorizationHeaderMalformed",
}
DENIED = {"AccessDenied", "403", "Forbidden", "AllAccessDisabled"}
NO_BUCKET = {"NoSuchBucket"}
# The request's signing time is too far from the server's clock (AWS and RGW: 15 minutes).
SKEWED = {"RequestTimeTooSkewed"}
# The bucket or its owner is at its quota (Ceph RGW): no write is taken until room is made.
OVER_QUOTA = {"QuotaExceeded"}
# S3 answers about one object (the bucket and the credentials are fine).
ONE_OBJECT = {"InvalidObjectState", "NoSuchVersion", "InvalidRange", "PreconditionFailed"}
ONE_OBJECT_STATUS = {404, 409, 412, 416}
# Where boto3 found the credentials: its provider's `method` ("env",
# "shared-credentials-file", "iam-role", ...; "" when not known) and the profile.
Source = tuple[str, str | None]


def is_backend_error(exc: BaseException) -> bool:
    """A failure of boto3/botocore (turned into StoreUnavailable), not a bug of ours."""
    return isinstance(exc, (bce.BotoCoreError, bce.ClientError, Boto3Error))


def error_code(exc: BaseException) -> str:
    """The S3 error code of a ClientError (or of a boto3 wrapper around one)."""
    if isinstance(exc, bce.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    if isinstance(exc, Boto3Error):  # e.g. S3UploadFailedError keeps only the text
        match = re.search(r"An error occurred \(([A-Za-z0-9]+)\)", str(exc))
        return match.group(1) if match else ""
    return ""


def about_one_object(exc: BaseException) -> bool:
    """Whether `exc` is S3's answer about one object, not about the store (see above)."""
    if isinstance(exc, (bce.FlexibleChecksumError, bce.ChecksumError)):
        return True
    code = error_code(exc)
    if code in ONE_OBJECT:
        return True
    if not isinstance(exc, bce.ClientError) or code in NO_BUCKET:
        return False
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status in ONE_OBJECT_STATUS


def object_message(op: str, key: str, exc: BaseException, *, bucket: str) -> str:
    """The line for an answer about one object (`about_one_object`, or a denial of one
    object the listing shows): what it costs and the fix."""
    detail = error_code(exc) or type(exc).__name__
    if detail == "InvalidObjectState":
        fix = "restore it, or copy it to the STANDARD storage class"
    elif detail in DENIED:
        fix = "check its ACL or KMS key, and the IAM policy for these credentials"
    else:
        fix = "check that object"
    return (
        f"S3 object '{key[-200:]}' in bucket '{bucket}' was not served during {op} "
        f"({detail}): a miss for that object only; {fix}"
    )


@dataclass(frozen=True)
class Bucket:
    """What a line about an S3 failure names: the bucket, the store's folder in it (`base`)
    and the bound on a call; `endpoint()` (redacted) and `source()` (where boto3 found the
    credentials) are asked only where the line shows them."""

    name: str
    base: str
    timeout_secs: float
    endpoint: Callable[[], str]
    source: Callable[[], Source] = lambda: ("", None)


def message(op: str, exc: BaseException, at: Bucket) -> str:
    """The line for `exc` during `op` on the bucket `at`."""
    where, base, endpoint = f"'{at.name}'", at.base, at.endpoint
    kind = type(exc).__name__
    if isinstance(exc, (bce.EndpointConnectionError, bce.ProxyConnectionError)):
        return (
            f"S3 bucket {where} not reachable at {endpoint()} ({kind}): "
            "check ARTSTORE_URL / AWS_ENDPOINT_URL_S3 and the network"
        )
    if isinstance(exc, (bce.ConnectTimeoutError, bce.ReadTimeoutError)):
        return (
            f"S3 bucket {where} at {endpoint()} did not answer within "
            f"{at.timeout_secs:g} s during {op} ({kind}): check the network "
            "or raise ARTSTORE_TIMEOUT"
        )
    if isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError)):
        return (
            f"no usable S3 credentials for bucket {where} ({kind}): set AWS_PROFILE "
            "or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or use an instance role)"
        )
    if isinstance(exc, bce.NoRegionError):
        return f"no AWS region configured for bucket {where} ({kind}): set AWS_DEFAULT_REGION"
    code = error_code(exc)
    if code in BAD_CREDENTIALS:
        fix = _credentials_fix(code, at.source)
        return f"S3 credentials rejected for bucket {where} ({code}): {fix}"
    if code in NO_BUCKET:
        return (
            f"S3 bucket {where} does not exist at {endpoint()} ({code}): "
            "create it or fix ARTSTORE_URL"
        )
    if code in OVER_QUOTA:
        return (
            f"S3 bucket {where} at {endpoint()} is over its quota ({code}) during {op}: "
            "nothing more is stored there until there is room; run `artstore gc --max-size "
            "SIZE` below the quota, or raise the bucket's quota"
        )
    if code in SKEWED:
        return (
            f"S3 bucket {where} at {endpoint()} refused this host's clock ({code}): the "
            "server takes requests signed within minutes of its own time (AWS: 15); "
            "set this host's clock right (NTP, chrony)"
        )
    if code in DENIED:
        return (
            f"S3 access denied for {op} in bucket {where} under '{base}/' ({code}): "
            "check the IAM policy for these credentials (see infra/policies/)"
        )
    detail = code or kind
    return (
        f"S3 {op} failed for bucket {where} at {endpoint()} ({detail}): "
        "check the S3 service and ARTSTORE_URL"
    )


_FILES = {
    "credentials": "the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, default "
    "~/.aws/credentials)",
    "config": "the AWS config file (AWS_CONFIG_FILE, default ~/.aws/config)",
}


def _credentials_fix(code: str, source: Callable[[], Source]) -> str:
    """What the rejection means and which setting holds the part to fix: the secret key,
    the key id or the session token, where boto3 read it (never their values)."""
    method, profile = source()
    if code == "AuthorizationHeaderMalformed":
        return "the request was signed for another region: check AWS_DEFAULT_REGION"
    part, variable, field = {
        "SignatureDoesNotMatch": ("secret key", "AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"),
        "InvalidAccessKeyId": ("access key id", "AWS_ACCESS_KEY_ID", "aws_access_key_id"),
        "InvalidClientTokenId": ("access key id", "AWS_ACCESS_KEY_ID", "aws_access_key_id"),
    }.get(code, ("session token", "AWS_SESSION_TOKEN", "aws_session_token"))
    what = {
        "secret key": "the secret key does not match the access key id",
        "access key id": "the access key id is unknown to this S3 service",
        "session token": "the session token has expired or is not valid",
    }[part]
    named = f"profile '{profile or 'default'}'"
    if method == "env":
        where = f"{variable} (the credentials come from the environment)"
    elif method == "shared-credentials-file":
        where = f"{field} of {named} in {_FILES['credentials']}"
    elif method == "config-file":
        where = f"{field} of {named} in {_FILES['config']}"
    elif method:
        where = f"the {part} of the credentials boto3 took from {method} ({named})"
    else:
        where = f"{variable}, or the {part} of AWS_PROFILE's profile"
    return f"{what}: check {where}"
