"""An S3 answer about one object is a miss for that object, not an outage (issue 48).

Anyone who may write the bucket can put an object S3 will not serve (storage class
GLACIER: `InvalidObjectState`). Measured before (moto S3 over HTTP + PostgreSQL, a
read-only reader trusting the team key, job.py's 12 entries): the first such answer
opened the reader's object-store breaker, and every other entry compiled for 60 s.
"""

from __future__ import annotations

from pathlib import Path

import botocore.exceptions as bce
import pytest
from conftest import TEAM_PUB, bucket_of, run_program, s3_client

from artifactstore.blobstores.s3errors import about_one_object


def _error(code: str, status: int) -> bce.ClientError:
    response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return bce.ClientError(response, "GetObject")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "status", "one_object"),
    [
        ("InvalidObjectState", 403, True),
        ("PreconditionFailed", 412, True),
        ("InvalidRange", 416, True),
        ("OperationAborted", 409, True),
        ("NoSuchBucket", 404, False),  # the whole store
        ("SlowDown", 503, False),  # throttling
        ("InternalError", 500, False),
        ("AccessDenied", 403, False),  # the policy, unless the key is listed (s3.py)
        ("InvalidAccessKeyId", 403, False),
    ],
)
def test_answers_are_classified(code: str, status: int, one_object: bool) -> None:
    assert about_one_object(_error(code, status)) is one_object


def test_transport_failures_are_outages() -> None:
    assert not about_one_object(bce.EndpointConnectionError(endpoint_url="http://x"))
    assert not about_one_object(bce.ReadTimeoutError(endpoint_url="http://x"))


def test_an_archived_object_costs_its_entry_only(team_env: dict[str, str], tmp_path: Path) -> None:
    """Slow: two JAX processes (about 15 s)."""
    first = run_program("job.py", {**team_env, "ARTSTORE_LOCAL_TIER": "off"})
    assert first["store"]["stored"] == 12, first["store"]
    s3, (bucket, prefix) = s3_client(team_env), bucket_of(team_env)
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/default/objects/")
    keys = sorted(item["Key"] for item in listing["Contents"])
    assert len(keys) == 12
    for key in keys[::4]:  # three of them archived in place, as a bucket writer can
        source = {"Bucket": bucket, "Key": key}
        s3.copy_object(Bucket=bucket, Key=key, CopySource=source, StorageClass="GLACIER")
    env = {k: v for k, v in team_env.items() if k != "ARTSTORE_SIGNING_KEY"}
    env.update(
        ARTSTORE_TRUSTED_KEYS=str(TEAM_PUB),
        ARTSTORE_READ_ONLY="1",
        ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"),
    )
    out = run_program("job.py", env)
    stats = out["store"]
    assert out["results"] == first["results"]
    assert stats["hits"] == 9 and stats.get("compiles", 0) == 3, stats
    assert "breaker_opened_object_store" not in stats, stats
    assert out["_stderr"].count("InvalidObjectState") == 1, out["_stderr"][-2000:]  # said once
    assert "unavailable" not in out["_stderr"], out["_stderr"][-2000:]
