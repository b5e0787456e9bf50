"""A team store for a benchmark run: moto S3 + a fresh PostgreSQL database."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "infra"))
import devstack

from artifactstore.config import keyfiles
from artifactstore.index import db


@contextlib.contextmanager
def team_store(bucket: str, database: str) -> Iterator[dict[str, str]]:
    """The environment of a process using a fresh team store (schema applied, credentials
    and a writer key set: a team store requires signatures, and a process trusts its own
    key); the bucket's server, the database and the key are gone afterwards."""
    server = devstack.start_moto()
    keys = tempfile.TemporaryDirectory(prefix="artstore-bench-keys-")
    secret, _ = keyfiles.generate("bench", keys.name)
    try:
        devstack.create_bucket(server.endpoint, bucket)
        url = devstack.create_database(database)
        try:
            engine = db.open_engine(url)
            db.upgrade(engine)
            engine.dispose()
            yield {
                "ARTSTORE_URL": f"s3://{bucket}/cache",
                "ARTSTORE_INDEX": url,
                "AWS_ENDPOINT_URL_S3": server.endpoint,
                "ARTSTORE_SIGNING_KEY": str(secret),
                **devstack.FAKE_CREDENTIALS,
            }
        finally:
            devstack.drop_database(database)
    finally:
        server.stop()
        keys.cleanup()
