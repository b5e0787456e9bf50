"""A team store for a benchmark run: moto S3 + a fresh PostgreSQL database."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "infra"))
import devstack

from artifactstore.index import db


@contextlib.contextmanager
def team_store(bucket: str, database: str) -> Iterator[dict[str, str]]:
    """The environment of a process using a fresh team store (schema applied, credentials
    set); the bucket's server and the database are gone afterwards."""
    server = devstack.start_moto()
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
                **devstack.FAKE_CREDENTIALS,
            }
        finally:
            devstack.drop_database(database)
    finally:
        server.stop()
