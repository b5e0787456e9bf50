"""Settings from `configure()` arguments and `ARTSTORE_*` environment variables.

Parsing lives here, apart from the backends, so that a malformed URL or option
fails with one line before anything is opened; what each setting is and how it is
parsed is its row of `config.table`, so `resolve` only merges, and does what ties
settings together (where the store is, whose signatures count).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

from artifactstore.config import defaults as d
from artifactstore.config.table import BY_KEYWORD, SETTINGS
from artifactstore.config.urls import BlobLocation, parse_blob_url, parse_index_url
from artifactstore.config.values import parse_metrics
from artifactstore.errors import ConfigError
from artifactstore.redact import redact, remember_secrets_in

if TYPE_CHECKING:
    from artifactstore.formats.signing import SigningKey, TrustedKeys


@dataclass(frozen=True)
class Settings:
    """Everything needed to open a store; immutable once built. The defaults are the
    table's (`config.table`; tests/test_settings_table.py keeps them equal), typed here."""

    blobs: BlobLocation
    index_url: str
    namespace: str = d.DEFAULT_NAMESPACE
    read_only: bool = False
    min_compile_secs: float = d.DEFAULT_MIN_COMPILE_SECS
    timeout_secs: float = d.DEFAULT_TIMEOUT_SECS
    flush_secs: float = d.DEFAULT_FLUSH_SECS
    db_pool_size: int = d.DEFAULT_DB_POOL_SIZE
    db_idle_secs: float = d.DEFAULT_DB_IDLE_SECS
    journal_secs: float = d.DEFAULT_JOURNAL_SECS
    s3_endpoint_url: str | None = None
    cache_callbacks: bool = True
    local_tier: str | None = None  # a directory, "off", or None for the default place
    local_tier_bytes: int = d.DEFAULT_LOCAL_TIER_BYTES
    enforce_quota: bool = False  # a background gc pass after this process's writes
    breaker_failures: int = d.DEFAULT_BREAKER_FAILURES
    breaker_cooldown_secs: float = d.DEFAULT_BREAKER_COOLDOWN_SECS
    max_object_bytes: int = d.DEFAULT_MAX_OBJECT_BYTES  # a stored object, compressed
    max_executable_bytes: int = d.DEFAULT_MAX_EXECUTABLE_BYTES  # the executable it inflates to
    bundle_max_entries: int = d.DEFAULT_BUNDLE_MAX_ENTRIES  # entries of one imported bundle
    bundle_max_bytes: int | None = None  # what a bundle unpacks to; None: from its size
    # Signed entries (artifactstore.formats.signing): the key this writer signs with (read from
    # the .key file ARTSTORE_SIGNING_KEY names), and the keys this reader accepts: those
    # listed plus its own (see `_trust`); None only where signatures are not required and
    # none are listed: every intact object is loaded (the digest proves integrity only).
    # Empty: this process loads nothing. Required by default on a team (S3) store.
    signing_key: SigningKey | None = field(default=None, repr=False)
    trusted_keys: TrustedKeys | None = field(default=None, repr=False)
    require_signatures: bool = False
    embedded: bool = field(default=False)
    # A local store's new directories and files readable by their group (0750/0640)
    # rather than private (0700/0600), to share it read-only; never group-writable.
    group_readable: bool = False
    # Single-flight compiles: "auto" (see singleflight.enabled), "on" or "off"; how long
    # a waiter waits at most (None: from the key's last known compile time), the lease TTL.
    single_flight: str = "auto"
    lease_wait_secs: float | None = None
    lease_ttl_secs: float = d.DEFAULT_LEASE_TTL_SECS
    lease_max_hold_secs: float = d.DEFAULT_LEASE_MAX_HOLD_SECS
    # How long a read-only reader waits for a writer's compile at most (store.lease).
    lease_reader_wait_secs: float = d.DEFAULT_LEASE_READER_WAIT_SECS
    # Prometheus metrics (artifactstore.metrics): serve this process's counters on this
    # port (None: not served), bound to `metrics_addr`.
    metrics_port: int | None = None
    metrics_addr: str = d.DEFAULT_METRICS_ADDR
    # Why the metrics settings were refused: metrics are optional, so a typo there turns
    # off metrics alone (one log line), never the store.
    metrics_error: str | None = None
    # Working-set prefetch (artifactstore.jaxhook.prefetch): on, off, or None (auto: on
    # for accelerators, off on the CPU, where loading ahead competes with the program's
    # own tracing for the same cores); the bound on what it holds, and the program's name
    # for its record (None: the script's resolved path).
    prefetch: bool | None = None
    prefetch_max_bytes: int = d.DEFAULT_PREFETCH_BYTES
    program: str | None = None

    @property
    def index_is_server(self) -> bool:
        """A database server (PostgreSQL), whose connections are few and shared by the
        cluster, rather than a SQLite file: the read path never asks it (issue 16)."""
        return not self.index_url.lower().startswith("sqlite")

    def __repr__(self) -> str:
        """The dataclass's repr, redacted: configure() returns Settings, and a program
        that prints or logs them must not print the index URL's password."""
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return redact(f"Settings({shown})")


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
    if fields["require_signatures"] is None:
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
