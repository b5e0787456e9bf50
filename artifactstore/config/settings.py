"""Settings from `configure()` arguments and `ARTSTORE_*` environment variables.

Parsing lives here, apart from the backends, so that a malformed URL or option
fails with one line before anything is opened. `_OPTIONS` is the table the
configuration reference is generated from (docs/hooks/reference.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

from artifactstore.config.defaults import (
    DEFAULT_BREAKER_COOLDOWN_SECS,
    DEFAULT_BREAKER_FAILURES,
    DEFAULT_BUNDLE_MAX_ENTRIES,
    DEFAULT_DB_IDLE_SECS,
    DEFAULT_DB_POOL_SIZE,
    DEFAULT_FLUSH_SECS,
    DEFAULT_JOURNAL_SECS,
    DEFAULT_LEASE_MAX_HOLD_SECS,
    DEFAULT_LEASE_READER_WAIT_SECS,
    DEFAULT_LEASE_TTL_SECS,
    DEFAULT_LOCAL_TIER_BYTES,
    DEFAULT_MAX_EXECUTABLE_BYTES,
    DEFAULT_MAX_OBJECT_BYTES,
    DEFAULT_METRICS_ADDR,
    DEFAULT_MIN_COMPILE_SECS,
    DEFAULT_NAMESPACE,
    DEFAULT_PREFETCH_BYTES,
    DEFAULT_TIMEOUT_SECS,
    ENV_PREFIX,
)
from artifactstore.config.urls import BlobLocation, parse_blob_url, parse_index_url
from artifactstore.config.values import (
    check_namespace,
    parse_auto_bool,
    parse_bool,
    parse_count,
    parse_float,
    parse_limit,
    parse_metrics,
    parse_single_flight,
    parse_tier,
    parse_tier_size,
)
from artifactstore.errors import ConfigError
from artifactstore.redact import redact, remember_secrets_in

if TYPE_CHECKING:
    from artifactstore.formats.signing import SigningKey, TrustedKeys


@dataclass(frozen=True)
class Settings:
    """Everything needed to open a store; immutable once built."""

    blobs: BlobLocation
    index_url: str
    namespace: str = DEFAULT_NAMESPACE
    read_only: bool = False
    min_compile_secs: float = DEFAULT_MIN_COMPILE_SECS
    timeout_secs: float = DEFAULT_TIMEOUT_SECS
    flush_secs: float = DEFAULT_FLUSH_SECS
    db_pool_size: int = DEFAULT_DB_POOL_SIZE
    db_idle_secs: float = DEFAULT_DB_IDLE_SECS
    journal_secs: float = DEFAULT_JOURNAL_SECS
    s3_endpoint_url: str | None = None
    cache_callbacks: bool = True
    local_tier: str | None = None  # a directory, "off", or None for the default place
    local_tier_bytes: int = DEFAULT_LOCAL_TIER_BYTES
    enforce_quota: bool = False  # a background gc pass after this process's writes
    breaker_failures: int = DEFAULT_BREAKER_FAILURES
    breaker_cooldown_secs: float = DEFAULT_BREAKER_COOLDOWN_SECS
    max_object_bytes: int = DEFAULT_MAX_OBJECT_BYTES  # a stored object, compressed
    max_executable_bytes: int = DEFAULT_MAX_EXECUTABLE_BYTES  # the executable it inflates to
    bundle_max_entries: int = DEFAULT_BUNDLE_MAX_ENTRIES  # entries of one imported bundle
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
    lease_ttl_secs: float = DEFAULT_LEASE_TTL_SECS
    lease_max_hold_secs: float = DEFAULT_LEASE_MAX_HOLD_SECS
    # How long a read-only reader waits for a writer's compile at most (store.lease).
    lease_reader_wait_secs: float = DEFAULT_LEASE_READER_WAIT_SECS
    # Prometheus metrics (artifactstore.metrics): serve this process's counters on this
    # port (None: not served), bound to `metrics_addr`.
    metrics_port: int | None = None
    metrics_addr: str = DEFAULT_METRICS_ADDR
    # Why the metrics settings were refused: metrics are optional, so a typo there turns
    # off metrics alone (one log line), never the store.
    metrics_error: str | None = None
    # Working-set prefetch (artifactstore.jaxhook.prefetch): on, off, or None (auto: on
    # for accelerators, off on the CPU, where loading ahead competes with the program's
    # own tracing for the same cores); the bound on what it holds, and the program's name
    # for its record (None: the script's resolved path).
    prefetch: bool | None = None
    prefetch_max_bytes: int = DEFAULT_PREFETCH_BYTES
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


# configure() keyword -> (environment variable, parser)
_OPTIONS: dict[str, str] = {
    "url": "URL",
    "index": "INDEX",
    "namespace": "NAMESPACE",
    "read_only": "READ_ONLY",
    "min_compile_secs": "MIN_COMPILE_SECS",
    "timeout_secs": "TIMEOUT",
    "flush_secs": "FLUSH_TIMEOUT",
    "db_pool_size": "DB_POOL_SIZE",
    "db_idle_secs": "DB_IDLE_SECS",
    "journal_secs": "JOURNAL_SECS",
    "s3_endpoint_url": "S3_ENDPOINT_URL",
    "cache_callbacks": "CACHE_CALLBACKS",
    "local_tier": "LOCAL_TIER",
    "local_tier_size": "LOCAL_TIER_SIZE",
    "enforce_quota": "ENFORCE_QUOTA",
    "breaker_failures": "BREAKER_FAILURES",
    "breaker_cooldown_secs": "BREAKER_COOLDOWN",
    "max_object_size": "MAX_OBJECT_SIZE",
    "max_executable_size": "MAX_EXECUTABLE_SIZE",
    "bundle_max_entries": "BUNDLE_MAX_ENTRIES",
    "bundle_max_size": "BUNDLE_MAX_SIZE",
    "signing_key": "SIGNING_KEY",
    "trusted_keys": "TRUSTED_KEYS",
    "require_signatures": "REQUIRE_SIGNATURES",
    "group_readable": "GROUP_READABLE",
    "single_flight": "SINGLE_FLIGHT",
    "lease_wait_secs": "LEASE_WAIT",
    "lease_ttl_secs": "LEASE_TTL",
    "lease_max_hold_secs": "LEASE_MAX_HOLD",
    "lease_reader_wait_secs": "LEASE_READER_WAIT",
    "metrics_port": "METRICS_PORT",
    "metrics_addr": "METRICS_ADDR",
    "prefetch": "PREFETCH",
    "prefetch_max_size": "PREFETCH_MAX_SIZE",
    "program": "PROGRAM",
}


def resolve(
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
    *,
    need_index: bool = True,
) -> Settings:
    """Merge explicit options over `ARTSTORE_*` variables over the embedded default.

    `need_index=False`: a command that reads the object store alone (`artstore pull`)
    accepts an S3 store without ARTSTORE_INDEX; its `index_url` is then ""."""
    env = os.environ if environ is None else environ
    given = dict(overrides or {})
    unknown = sorted(set(given) - set(_OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown option {unknown[0]!r} for artifactstore.configure(): "
            f"known options are {', '.join(_OPTIONS)}"
        )
    values: dict[str, Any] = {}
    for option, env_name in _OPTIONS.items():
        if given.get(option) is not None:
            values[option] = given[option]
        elif env.get(ENV_PREFIX + env_name, "") != "":
            values[option] = env[ENV_PREFIX + env_name]
    for option in ("url", "index", "s3_endpoint_url"):
        if isinstance(values.get(option), str):
            # Before anything can fail and quote it: its passwords are masked everywhere.
            remember_secrets_in(values[option])

    embedded = "url" not in values
    if embedded:
        root = default_cache_dir()
        blobs = BlobLocation("file", str(root / "objects"))
        default_index = "sqlite:///" + str(root / "index.db")
    else:
        blobs = parse_blob_url(str(values["url"]))
        default_index = ""
        if blobs.scheme == "file":
            default_index = "sqlite:///" + str(Path(blobs.path) / "index.db")
    if "index" in values:
        index_url = parse_index_url(str(values["index"]))
    elif default_index or not need_index:
        index_url = default_index
    else:
        raise ConfigError(
            "an S3 store needs a shared index: set ARTSTORE_INDEX (or index=) to "
            "postgresql+psycopg://user@host/db"
        )
    endpoint = values.get("s3_endpoint_url")
    if endpoint is not None and not re.match(r"^https?://[^/\s]+", str(endpoint)):
        raise ConfigError(
            f"invalid S3 endpoint {endpoint!r}: use http(s)://host:port, e.g. http://127.0.0.1:9000"
        )
    signing_key = _parse_signing_key(values.get("signing_key"))
    # Nix's require-sigs: on a team store, write access to the bucket alone must not
    # decide what every reader runs; a local directory is its owner's (modes guard it).
    required = parse_bool(
        ENV_PREFIX + "REQUIRE_SIGNATURES",
        values.get("require_signatures", blobs.scheme != "file"),
    )
    return Settings(
        blobs=blobs,
        index_url=index_url,
        namespace=check_namespace(str(values.get("namespace", DEFAULT_NAMESPACE))),
        read_only=parse_bool(ENV_PREFIX + "READ_ONLY", values.get("read_only", False)),
        min_compile_secs=parse_float(
            ENV_PREFIX + "MIN_COMPILE_SECS",
            values.get("min_compile_secs", DEFAULT_MIN_COMPILE_SECS),
        ),
        timeout_secs=parse_float(
            ENV_PREFIX + "TIMEOUT", values.get("timeout_secs", DEFAULT_TIMEOUT_SECS), minimum=0.01
        ),
        flush_secs=parse_float(
            ENV_PREFIX + "FLUSH_TIMEOUT", values.get("flush_secs", DEFAULT_FLUSH_SECS)
        ),
        db_pool_size=parse_count(
            "DB_POOL_SIZE", values.get("db_pool_size", DEFAULT_DB_POOL_SIZE), maximum=100
        ),
        db_idle_secs=parse_float(
            ENV_PREFIX + "DB_IDLE_SECS", values.get("db_idle_secs", DEFAULT_DB_IDLE_SECS)
        ),
        journal_secs=parse_float(
            ENV_PREFIX + "JOURNAL_SECS", values.get("journal_secs", DEFAULT_JOURNAL_SECS)
        ),
        s3_endpoint_url=str(endpoint) if endpoint else None,
        cache_callbacks=parse_bool(
            ENV_PREFIX + "CACHE_CALLBACKS", values.get("cache_callbacks", True)
        ),
        local_tier=parse_tier(values.get("local_tier")),
        local_tier_bytes=parse_tier_size(values.get("local_tier_size")),
        enforce_quota=parse_bool(ENV_PREFIX + "ENFORCE_QUOTA", values.get("enforce_quota", False)),
        breaker_failures=parse_count(
            "BREAKER_FAILURES", values.get("breaker_failures", DEFAULT_BREAKER_FAILURES), 1000
        ),
        breaker_cooldown_secs=parse_float(
            ENV_PREFIX + "BREAKER_COOLDOWN",
            values.get("breaker_cooldown_secs", DEFAULT_BREAKER_COOLDOWN_SECS),
        ),
        max_object_bytes=parse_limit(
            "MAX_OBJECT_SIZE", values.get("max_object_size"), DEFAULT_MAX_OBJECT_BYTES
        ),
        max_executable_bytes=parse_limit(
            "MAX_EXECUTABLE_SIZE", values.get("max_executable_size"), DEFAULT_MAX_EXECUTABLE_BYTES
        ),
        bundle_max_entries=parse_count(
            "BUNDLE_MAX_ENTRIES",
            values.get("bundle_max_entries", DEFAULT_BUNDLE_MAX_ENTRIES),
            maximum=10**9,
        ),
        bundle_max_bytes=(
            None
            if values.get("bundle_max_size") in (None, "")
            else parse_limit("BUNDLE_MAX_SIZE", values["bundle_max_size"], 1)
        ),
        signing_key=signing_key,
        trusted_keys=_trust(_parse_trusted_keys(values.get("trusted_keys")), signing_key, required),
        require_signatures=required,
        embedded=embedded,
        group_readable=parse_bool(
            ENV_PREFIX + "GROUP_READABLE", values.get("group_readable", False)
        ),
        single_flight=parse_single_flight(values.get("single_flight", "auto")),
        lease_wait_secs=(
            None
            if values.get("lease_wait_secs") is None
            else parse_float(ENV_PREFIX + "LEASE_WAIT", values["lease_wait_secs"])
        ),
        lease_ttl_secs=parse_float(
            ENV_PREFIX + "LEASE_TTL",
            values.get("lease_ttl_secs", DEFAULT_LEASE_TTL_SECS),
            minimum=0.5,
            maximum=3600,
        ),
        lease_max_hold_secs=parse_float(
            ENV_PREFIX + "LEASE_MAX_HOLD",
            values.get("lease_max_hold_secs", DEFAULT_LEASE_MAX_HOLD_SECS),
            minimum=1,
        ),
        lease_reader_wait_secs=parse_float(
            ENV_PREFIX + "LEASE_READER_WAIT",
            values.get("lease_reader_wait_secs", DEFAULT_LEASE_READER_WAIT_SECS),
        ),
        prefetch=parse_auto_bool(ENV_PREFIX + "PREFETCH", values.get("prefetch", "auto")),
        prefetch_max_bytes=parse_limit(
            "PREFETCH_MAX_SIZE", values.get("prefetch_max_size"), DEFAULT_PREFETCH_BYTES
        ),
        program=str(values["program"])[:1024] if values.get("program") else None,
        **parse_metrics(values),
    )


def _parse_signing_key(value: Any) -> SigningKey | None:
    """ARTSTORE_SIGNING_KEY: the path of a .key file (never the key itself)."""
    if value is None or value == "":
        return None
    from artifactstore.config.keyfiles import load_signing_key
    from artifactstore.formats.signing import SigningKey

    if isinstance(value, SigningKey):
        return value
    return load_signing_key(str(Path(str(value)).expanduser()))


def _parse_trusted_keys(value: Any) -> TrustedKeys | None:
    """ARTSTORE_TRUSTED_KEYS: comma-separated .pub files or NAME:BASE64 public keys."""
    if value is None or value == "":
        return None
    from artifactstore.config.keyfiles import load_trusted_keys
    from artifactstore.formats.signing import TrustedKeys

    if isinstance(value, TrustedKeys):
        return value
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    return load_trusted_keys(str(value))


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
