"""Settings from `configure()` arguments and `ARTSTORE_*` environment variables.

Parsing lives here, apart from the backends, so that a malformed URL or option
fails with one line before anything is opened; what each setting is and how it is
parsed is its row of `config.table`, so `resolve` only merges, and does what ties
settings together (where the store is, whose signatures count).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

from artifactstore.config.table import BY_KEYWORD, SETTINGS, Settings
from artifactstore.config.urls import BlobLocation, parse_blob_url, parse_index_url
from artifactstore.config.values import parse_metrics
from artifactstore.errors import ConfigError
from artifactstore.redact import remember_secrets_in

if TYPE_CHECKING:
    from artifactstore.formats.signing import SigningKey, TrustedKeys


def default_cache_dir() -> Path:
    """The user's cache directory (honours XDG_CACHE_HOME on Linux)."""
    return Path(platformdirs.user_cache_dir("artifactstore", appauthor=False))


def resolve(
    overrides: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    need_index: bool = True,
) -> Settings:
    """Merge explicit options over `ARTSTORE_*` variables over the embedded default, each
    parsed by its row of the table (`config.table`).

    `need_index=False`: a command that reads the object store alone (`artstore pull`)
    accepts an S3 store without ARTSTORE_INDEX; its `index_url` is then ""."""
    given = _given(overrides or {}, os.environ if environ is None else environ)
    blobs, index_url = _locate(given, need_index)
    fields: dict[str, Any] = {}
    for row in SETTINGS:
        if row.parse is not None:
            raw = given.get(row.keyword or "")
            fields[row.attr] = row.default if raw is None else row.parse(row.env, raw, row.default)
    # Nix's require-sigs: on a team store, write access to the bucket alone must not
    # decide what every reader runs; a local directory is its owner's (modes guard it).
    if "require_signatures" not in given:
        fields["require_signatures"] = blobs.scheme != "file"
    fields["trusted_keys"] = _trust(
        fields["trusted_keys"], fields["signing_key"], fields["require_signatures"]
    )
    return Settings(
        blobs=blobs,
        index_url=index_url,
        embedded="url" not in given,
        **fields,
        **parse_metrics(given),
    )


def _given(overrides: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Each setting's value as given, by keyword: an argument, else its variable (an empty
    one counts as unset); unknown keywords refused with the list of known ones."""
    unknown = sorted(set(overrides) - set(BY_KEYWORD))
    if unknown:
        raise ConfigError(
            f"unknown option {unknown[0]!r} for artifactstore.configure(): "
            f"known options are {', '.join(BY_KEYWORD)}"
        )
    given: dict[str, Any] = {}
    for keyword, row in BY_KEYWORD.items():
        if overrides.get(keyword) is not None:
            given[keyword] = overrides[keyword]
        elif env.get(row.env, "") != "":
            given[keyword] = env[row.env]
    for keyword in ("url", "index", "s3_endpoint_url"):
        if isinstance(given.get(keyword), str):
            # Before anything can fail and quote it: its passwords are masked everywhere.
            remember_secrets_in(given[keyword])
    return given


def _locate(given: dict[str, Any], need_index: bool) -> tuple[BlobLocation, str]:
    """Where objects and the index live: the URLs given, else the embedded default."""
    if "url" not in given:
        root = default_cache_dir()
        blobs = BlobLocation("file", str(root / "objects"))
        default_index = "sqlite:///" + str(root / "index.db")
    else:
        blobs = parse_blob_url(str(given["url"]))
        default_index = ""
        if blobs.scheme == "file":
            default_index = "sqlite:///" + str(Path(blobs.path) / "index.db")
    if "index" in given:
        return blobs, parse_index_url(str(given["index"]))
    if default_index or not need_index:
        return blobs, default_index
    raise ConfigError(
        "an S3 store needs a shared index: set ARTSTORE_INDEX (or index=) to "
        "postgresql+psycopg://user@host/db"
    )


def _trust(
    listed: TrustedKeys | None, signing_key: SigningKey | None, required: bool
) -> TrustedKeys | None:
    """The keys whose signatures this process accepts: the listed ones and its own (it
    runs what it signed); None, every intact object, only when none are listed and
    signatures are not required; empty when required and there are none (loads nothing)."""
    if listed is None and not required:
        return None
    from artifactstore.formats.signing import TrustedKeys

    keys = listed if listed is not None else TrustedKeys(())
    if signing_key is None:
        return keys
    for name, raw in keys.keys:
        if signing_key.is_seed(raw):  # never echoed: the setting holds a secret key
            raise ConfigError(
                f"ARTSTORE_TRUSTED_KEYS lists {name!r} as the secret key of "
                "ARTSTORE_SIGNING_KEY, not its public key: list the NAME.pub file (and "
                "rotate the key: it was exposed wherever that setting was)"
            )
    return keys.including(signing_key.public_key())
