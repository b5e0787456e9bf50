"""Settings from `configure()` arguments and `ARTSTORE_*` environment variables.

Parsing lives here, apart from the backends, so that a malformed URL or option
fails with one line before anything is opened.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import platformdirs

from artifactstore.errors import ConfigError
from artifactstore.redact import redact, remember_secrets_in

if TYPE_CHECKING:
    from artifactstore.formats.signing import SigningKey, TrustedKeys

ENV_PREFIX = "ARTSTORE_"
DEFAULT_NAMESPACE = "default"
# XLA:CPU compiles of trivial functions take ~10-50 ms, about what a store
# round trip costs; below this a store lookup cannot pay for itself and would
# fill the index with noise. JAX's own cache defaults to 1 s; we store more
# because a team store amortises every entry over many processes.
DEFAULT_MIN_COMPILE_SECS = 0.1
DEFAULT_TIMEOUT_SECS = 10.0
DEFAULT_FLUSH_SECS = 60.0
# A team index's connections per process (pool size, and as many again in overflow),
# and how long an unused one stays open: a process that compiled once and then
# trains for a day holds none (PostgreSQL serves max_connections, 100 by default).
DEFAULT_DB_POOL_SIZE = 4
DEFAULT_DB_IDLE_SECS = 10.0
# How often a running process writes its hits as a journal object (artifactstore.formats.journal)
# when its index is a database server: few objects for gc to fold, hits never older.
DEFAULT_JOURNAL_SECS = 60.0
# Circuit breaker on the store: every failure already cost up to ARTSTORE_TIMEOUT,
# so one is enough to stop paying; a minute later one probe finds out if it is back.
DEFAULT_BREAKER_FAILURES = 1
DEFAULT_BREAKER_COOLDOWN_SECS = 60.0
# Private copies of a remote store's objects on each host; big enough for a
# few large GPU programs, small next to a training node's scratch disk.
DEFAULT_LOCAL_TIER_BYTES = 10 * 1000**3
# Bounds on what a reader loads (a stored object, and the executable it inflates to),
# so that a damaged or hostile object costs a miss, not the process's memory. XLA
# executables reach a few GB for large GPU programs and zstd shrinks them 3-4x: 4 GiB
# of object and 8 GiB of executable leave about twice the largest we know of, while a
# decompression bomb (a 64 KiB object declaring 1 TB) is refused before any allocation.
DEFAULT_MAX_OBJECT_BYTES = 4 * 1024**3
DEFAULT_MAX_EXECUTABLE_BYTES = 8 * 1024**3
# `artstore import` (artifactstore.bundles.bounds): at most this many entries a bundle;
# what it may unpack to in all is ARTSTORE_BUNDLE_MAX_SIZE, by default a multiple of its size.
DEFAULT_BUNDLE_MAX_ENTRIES = 10_000
# Compile leases (artifactstore.store.flight): a holder renews its lease every TTL/3, so a
# holder that died is taken over after one TTL (at once when it ran on the same host).
DEFAULT_LEASE_TTL_SECS = 30.0
# No lease (compile or gc) stands longer than this ahead of now: a row expiring later
# (a writer's forgery, a clock far ahead) is taken over as expired, a holder renews no
# further, and no waiter waits longer unless ARTSTORE_LEASE_WAIT says so. Twice gc's
# lease TTL (index.leases.DEFAULT_TTL_SECS).
DEFAULT_LEASE_MAX_HOLD_SECS = 600.0
SINGLE_FLIGHT_MODES = ("auto", "on", "off")
# Where a process serves its metrics (ARTSTORE_METRICS_PORT): this host only, unless asked.
DEFAULT_METRICS_ADDR = "127.0.0.1"

_NAMESPACE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class BlobLocation:
    """Where objects live: a local directory or an S3 bucket and prefix."""

    scheme: str  # "file" or "s3"
    path: str  # directory for file; key prefix for s3 (no leading/trailing "/")
    bucket: str = ""

    def describe(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.path}".rstrip("/")
        return self.path


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
    # Prometheus metrics (artifactstore.metrics): serve this process's counters on this
    # port (None: not served), bound to `metrics_addr`.
    metrics_port: int | None = None
    metrics_addr: str = DEFAULT_METRICS_ADDR
    # Why the metrics settings were refused: metrics are optional, so a typo there turns
    # off metrics alone (one log line), never the store.
    metrics_error: str | None = None

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


def parse_blob_url(url: str) -> BlobLocation:
    """`file:///abs/dir`, a plain path, or `s3://bucket/prefix`."""
    text = url.strip()
    if not text:
        raise ConfigError("empty store URL: use a directory, file:///path or s3://bucket/prefix")
    if not text.isprintable():  # urlsplit would silently drop tabs and newlines
        raise ConfigError(
            "store URL contains control characters: use a directory, file:///path or "
            "s3://bucket/prefix"
        )
    if "://" not in text:
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", text) and not re.match(r"^[A-Za-z]:[\\/]", text):
            raise ConfigError(
                f"malformed store URL {text!r}: use a directory, file:///path or s3://bucket/prefix"
            )
        return BlobLocation("file", str(Path(text).expanduser().resolve()))
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(
                f"file URL {text!r} names host {parts.netloc!r}: use file:///absolute/path"
            )
        if not parts.path:
            raise ConfigError(f"file URL {text!r} has no path: use file:///absolute/path")
        return BlobLocation("file", str(Path(unquote(parts.path)).resolve()))
    if scheme == "s3":
        bucket = parts.netloc
        if "@" in bucket:
            raise ConfigError(
                "S3 URLs must not carry credentials: use s3://bucket/prefix and "
                "boto3's standard credential chain (AWS_PROFILE, AWS_ACCESS_KEY_ID, ...)"
            )
        if not _BUCKET_RE.fullmatch(bucket):
            raise ConfigError(
                f"invalid S3 bucket name {bucket!r} in store URL: use s3://bucket/prefix "
                "with a 3-63 character lowercase bucket name"
            )
        if parts.query or parts.fragment:
            raise ConfigError(f"S3 URL {text!r} has a query or fragment: use s3://bucket/prefix")
        return BlobLocation("s3", parts.path.strip("/"), bucket=bucket)
    raise ConfigError(
        f"unsupported store URL scheme {scheme!r}: use a directory, file:///path or "
        "s3://bucket/prefix"
    )


def parse_index_url(url: str) -> str:
    """Accept SQLAlchemy URLs for SQLite and PostgreSQL, or a plain SQLite path.

    Checked with the standard library's URL parser rather than SQLAlchemy's so
    that configuring a process does not import SQLAlchemy: a process whose
    compiles all hit the local tier never needs it. `index.db.open_engine`
    parses the URL fully when the index is opened.
    """
    text = url.strip()
    if "://" not in text:
        if not text:
            raise ConfigError("empty index URL: use sqlite:///path or postgresql+psycopg://...")
        return "sqlite:///" + str(Path(text).expanduser().resolve())
    malformed = ConfigError(
        "malformed index URL: use sqlite:///path/index.db or "
        "postgresql+psycopg://user@host:5432/dbname"
    )
    match = re.match(r"^([A-Za-z][A-Za-z0-9_]*)(?:\+([A-Za-z0-9_]+))?://", text)
    if match is None:
        raise malformed
    backend, driver = match.group(1).lower(), match.group(2)
    if backend not in ("sqlite", "postgresql"):
        raise ConfigError(
            f"unsupported index database {backend!r}: use sqlite:///path or "
            "postgresql+psycopg://user@host/db"
        )
    try:
        parts = urlsplit(text)
        _ = parts.port  # a non-numeric or out-of-range port
    except ValueError:
        raise malformed from None
    if parts.netloc.count("@") > 1 or (backend == "postgresql" and "@" in parts.path):
        # A password with a raw @ (or /) would be split into user, host and path, and the
        # parts after it would reach error messages: never echo such a URL.
        raise ConfigError(
            "the index URL's user or password contains a reserved character (@ / : #): "
            "percent-encode it (@ is %40) or leave the password out of the URL and use "
            "~/.pgpass or PGPASSWORD"
        )
    if backend == "postgresql" and driver is None:
        text = "postgresql+psycopg" + text[len(match.group(1)) :]
    return text


def parse_bool(name: str, value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"invalid boolean {value!r} for {name}: use 1/0, true/false, yes/no")


# Seconds: any bound beyond a day is a typo (and `inf` would overflow the waits it bounds).
MAX_SECS = 86400.0


def parse_float(
    name: str, value: str | float, *, minimum: float = 0.0, maximum: float = MAX_SECS
) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"invalid number {value!r} for {name}: use e.g. 0.5") from None
    if not minimum <= number <= maximum:  # also false for nan
        raise ConfigError(
            f"invalid value {value!r} for {name}: must be >= {minimum:g} and <= {maximum:g}"
        )
    return number


def _parse_count(env_name: str, value: Any, maximum: int) -> int:
    """A whole number of things, 1 to `maximum` (a fraction is rounded down)."""
    return int(parse_float(ENV_PREFIX + env_name, value, minimum=1, maximum=maximum))


def check_namespace(namespace: str) -> str:
    if not _NAMESPACE_RE.fullmatch(namespace):
        raise ConfigError(
            f"invalid namespace {namespace!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return namespace


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
    "metrics_port": "METRICS_PORT",
    "metrics_addr": "METRICS_ADDR",
}


def resolve(
    overrides: dict[str, Any] | None = None, environ: dict[str, str] | None = None
) -> Settings:
    """Merge explicit options over `ARTSTORE_*` variables over the embedded default."""
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
    elif default_index:
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
        db_pool_size=_parse_count(
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
        local_tier=_parse_tier(values.get("local_tier")),
        local_tier_bytes=_parse_tier_size(values.get("local_tier_size")),
        enforce_quota=parse_bool(ENV_PREFIX + "ENFORCE_QUOTA", values.get("enforce_quota", False)),
        breaker_failures=_parse_count(
            "BREAKER_FAILURES", values.get("breaker_failures", DEFAULT_BREAKER_FAILURES), 1000
        ),
        breaker_cooldown_secs=parse_float(
            ENV_PREFIX + "BREAKER_COOLDOWN",
            values.get("breaker_cooldown_secs", DEFAULT_BREAKER_COOLDOWN_SECS),
        ),
        max_object_bytes=_parse_limit(
            "MAX_OBJECT_SIZE", values.get("max_object_size"), DEFAULT_MAX_OBJECT_BYTES
        ),
        max_executable_bytes=_parse_limit(
            "MAX_EXECUTABLE_SIZE", values.get("max_executable_size"), DEFAULT_MAX_EXECUTABLE_BYTES
        ),
        bundle_max_entries=_parse_count(
            "BUNDLE_MAX_ENTRIES",
            values.get("bundle_max_entries", DEFAULT_BUNDLE_MAX_ENTRIES),
            maximum=10**9,
        ),
        bundle_max_bytes=(
            None
            if values.get("bundle_max_size") in (None, "")
            else _parse_limit("BUNDLE_MAX_SIZE", values["bundle_max_size"], 1)
        ),
        signing_key=signing_key,
        trusted_keys=_trust(_parse_trusted_keys(values.get("trusted_keys")), signing_key, required),
        require_signatures=required,
        embedded=embedded,
        group_readable=parse_bool(
            ENV_PREFIX + "GROUP_READABLE", values.get("group_readable", False)
        ),
        single_flight=_parse_single_flight(values.get("single_flight", "auto")),
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
        **_parse_metrics(values),
    )


def _parse_metrics(values: dict[str, Any]) -> dict[str, Any]:
    """metrics_port and metrics_addr, or none of them and why (`metrics_error`)."""
    try:
        return {
            "metrics_port": _parse_port(values.get("metrics_port")),
            "metrics_addr": _parse_addr(values.get("metrics_addr")),
        }
    except ConfigError as exc:
        return {"metrics_port": None, "metrics_error": f"{exc}; the store works without them"}


def _parse_single_flight(value: Any) -> str:
    """ARTSTORE_SINGLE_FLIGHT: auto (the default), or a boolean."""
    text = str(value).strip().lower()
    if text in SINGLE_FLIGHT_MODES:
        return text
    try:
        return "on" if parse_bool(ENV_PREFIX + "SINGLE_FLIGHT", value) else "off"
    except ConfigError:
        raise ConfigError(
            f"invalid value {value!r} for {ENV_PREFIX}SINGLE_FLIGHT: use auto, 1 or 0"
        ) from None


def _parse_port(value: Any) -> int | None:
    """ARTSTORE_METRICS_PORT: 1 to 65535; 0 or empty: metrics not served."""
    if value is None or value == "":
        return None
    name = ENV_PREFIX + "METRICS_PORT"
    if isinstance(value, bool) or not str(value).strip().isdigit():
        raise ConfigError(f"invalid port {value!r} for {name}: use e.g. 9464 (0: off)")
    port = int(str(value).strip())
    if port > 65535:
        raise ConfigError(f"invalid port {value!r} for {name}: must be <= 65535 (0: off)")
    return port or None


def _parse_addr(value: Any) -> str:
    """ARTSTORE_METRICS_ADDR: the address the metrics port is bound to (a host name or IP)."""
    if value is None or value == "":
        return DEFAULT_METRICS_ADDR
    text = str(value).strip()
    if not re.fullmatch(r"[A-Za-z0-9._:-]{1,255}", text):
        raise ConfigError(
            f"invalid address {text!r} for {ENV_PREFIX}METRICS_ADDR: use an IP address or "
            "host name, e.g. 0.0.0.0 to serve every interface"
        )
    return text


def _parse_signing_key(value: Any) -> SigningKey | None:
    """ARTSTORE_SIGNING_KEY: the path of a .key file (never the key itself)."""
    if value is None or value == "":
        return None
    from artifactstore.formats.signing import SigningKey, load_signing_key

    if isinstance(value, SigningKey):
        return value
    return load_signing_key(str(Path(str(value)).expanduser()))


def _parse_trusted_keys(value: Any) -> TrustedKeys | None:
    """ARTSTORE_TRUSTED_KEYS: comma-separated .pub files or NAME:BASE64 public keys."""
    if value is None or value == "":
        return None
    from artifactstore.formats.signing import TrustedKeys

    if isinstance(value, TrustedKeys):
        return value
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    return TrustedKeys.parse(str(value))


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
    return keys if signing_key is None else keys.including(signing_key.public_key())


def _parse_tier(value: Any) -> str | None:
    if value is None or value == "":
        return None
    text = str(value).strip()
    if text.lower() in _FALSE or text.lower() == "none":
        return "off"
    return str(Path(text).expanduser().resolve())


def _parse_tier_size(value: Any) -> int:
    if value is None or value == "":
        return DEFAULT_LOCAL_TIER_BYTES
    if isinstance(value, int):
        return value
    from artifactstore.formats.sizes import parse_size

    return parse_size(str(value))


def _parse_limit(env_name: str, value: Any, default: int) -> int:
    """A size limit (`500M`, `4GiB`, or bytes as an int): at least one byte."""
    from artifactstore.formats.sizes import parse_size

    if value is None or value == "":
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        try:
            size = parse_size(str(value))
        except ConfigError as exc:
            raise ConfigError(f"{ENV_PREFIX}{env_name}: {exc}") from None
    if size < 1:
        raise ConfigError(
            f"invalid value {value!r} for {ENV_PREFIX}{env_name}: must be at least 1 byte, "
            "e.g. 4GiB"
        )
    return size
