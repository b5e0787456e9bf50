"""Every setting, declared once: its `ARTSTORE_*` name, `configure()` keyword, default,
parser and what it means.

`resolve()` parses by this table; the configuration reference (docs/hooks/reference.py),
`artstore doctor` and the CLI's `--help` texts are derived from it; with the variables
that are not settings (`config.variables`) it says which names are ours, so that a typo
is warned about. A setting written in one place cannot drift between them.
"""

from __future__ import annotations

import re
from typing import Any

from artifactstore.config import defaults as d
from artifactstore.config import values as v
from artifactstore.config.rows import GIVEN, Record, Var
from artifactstore.config.urls import BlobLocation


class Settings(Record):
    """Everything needed to open a store, immutable once built (`resolve`): one attribute
    per row below, in the reference's order, and what `resolve` derives besides.

    The signing rows: the key this writer signs with (read from the .key file
    ARTSTORE_SIGNING_KEY names), and the keys this reader accepts, those listed plus its
    own (`settings._trust`); None only where signatures are not required and none are
    listed (every intact object is loaded: the digest proves integrity only), empty where
    this process loads nothing.
    """

    blobs: Var[BlobLocation] = Var(
        "URL",
        "url",
        "URL",
        GIVEN,
        "The object store: a directory, `file:///path`, or `s3://bucket/prefix` (no "
        "credentials in the URL).",
        shown="`$XDG_CACHE_HOME/artifactstore/objects` (the embedded store)",
    )
    index_url: Var[str] = Var(
        "INDEX",
        "index",
        "URL",
        GIVEN,
        "`sqlite:///path` or `postgresql+psycopg://user@host/db` (no password: see "
        "[Security](../security.md#secrets)).",
        shown="SQLite: `index.db` beside the embedded store's `objects/`, or in the store's "
        "directory; none for S3 (required there)",
    )
    namespace = Var(
        "NAMESPACE",
        "namespace",
        "name",
        d.DEFAULT_NAMESPACE,
        "A team's or project's partition of one store, with its own quota.",
        v.namespace,
    )
    read_only = Var(
        "READ_ONLY",
        "read_only",
        "boolean",
        False,
        "Never write objects or entries (readers with read-only credentials). A store this "
        "user cannot write is opened read-only whatever this says.",
        v.boolean,
    )
    min_compile_secs = Var(
        "MIN_COMPILE_SECS",
        "min_compile_secs",
        "seconds",
        d.DEFAULT_MIN_COMPILE_SECS,
        "Compiles faster than this are not stored: they cost about what a store round trip "
        "costs. JAX's own cache uses 1 s; a team store amortises each entry over many "
        "processes, so it keeps more. `artstore warm` stores everything. This host's tier "
        "keeps them all the same, for its own later processes.",
        v.seconds(),
    )
    timeout_secs = Var(
        "TIMEOUT",
        "timeout_secs",
        "seconds",
        d.DEFAULT_TIMEOUT_SECS,
        "Bound, in seconds, on any one store operation (S3 retries included) before the "
        "program compiles instead (0.01 to 86400).",
        v.seconds(minimum=0.01),
    )
    flush_secs = Var(
        "FLUSH_TIMEOUT",
        "flush_secs",
        "seconds",
        d.DEFAULT_FLUSH_SECS,
        "Bound, in seconds, on finishing pending uploads at exit.",
        v.seconds(),
    )
    db_pool_size = Var(
        "DB_POOL_SIZE",
        "db_pool_size",
        "count",
        d.DEFAULT_DB_POOL_SIZE,
        "PostgreSQL connections a process keeps while it writes (as many again in bursts; 1 "
        "to 100). Keep it at 1-2 on large fleets, behind PgBouncer.",
        v.count(100),
    )
    db_idle_secs = Var(
        "DB_IDLE_SECS",
        "db_idle_secs",
        "seconds",
        d.DEFAULT_DB_IDLE_SECS,
        "A process closes its PostgreSQL connections after this long unused, so one that "
        "compiled and then trains for a day holds none.",
        v.seconds(),
    )
    journal_secs = Var(
        "JOURNAL_SECS",
        "journal_secs",
        "seconds",
        d.DEFAULT_JOURNAL_SECS,
        "On a team store, how often a running process writes its hits as a hit journal "
        "object (and once at exit); `artstore fold` or `gc` apply them to the index.",
        v.seconds(),
    )
    s3_endpoint_url = Var(
        "S3_ENDPOINT_URL",
        "s3_endpoint_url",
        "URL",
        None,
        "An S3-compatible endpoint (MinIO, Ceph, moto), `http(s)://host:port`.",
        v.endpoint,
        shown="boto3's (`AWS_ENDPOINT_URL_S3`)",
    )
    cache_callbacks = Var(
        "CACHE_CALLBACKS",
        "cache_callbacks",
        "boolean",
        True,
        "Store programs with host callbacks (`jax.debug.print`, `pure_callback`, equinox "
        "checks); `0` compiles them every time, as JAX's own cache did before 0.11.",
        v.boolean,
    )
    local_tier = Var(
        "LOCAL_TIER",
        "local_tier",
        "directory",
        None,
        "Where this host keeps copies of a remote (or read-only) store's executables, and "
        "its compiles too quick to store (any store); `off` disables it. See "
        "[the local tier](../jax.md#the-local-tier).",
        v.tier,
        shown="`$XDG_CACHE_HOME/artifactstore/tiers`",
    )
    local_tier_bytes = Var(
        "LOCAL_TIER_SIZE",
        "local_tier_size",
        "size",
        d.DEFAULT_LOCAL_TIER_BYTES,
        "Bound on that copy, and apart on the quick compiles kept; the least recently used "
        "go first.",
        v.tier_size,
    )
    enforce_quota = Var(
        "ENFORCE_QUOTA",
        "enforce_quota",
        "boolean",
        False,
        "After this process writes, a background `gc` pass keeps the namespace within its "
        "quota (see [quotas](../operations.md#quotas-between-gc-runs)).",
        v.boolean,
    )
    breaker_failures = Var(
        "BREAKER_FAILURES",
        "breaker_failures",
        "count",
        d.DEFAULT_BREAKER_FAILURES,
        "Consecutive store failures (each bounded by `ARTSTORE_TIMEOUT`) before that backend "
        "is bypassed.",
        v.count(1000),
    )
    breaker_cooldown_secs = Var(
        "BREAKER_COOLDOWN",
        "breaker_cooldown_secs",
        "seconds",
        d.DEFAULT_BREAKER_COOLDOWN_SECS,
        "How long it is bypassed (calls cost nothing) before one probe tries it again.",
        v.seconds(),
    )
    max_object_bytes = Var(
        "MAX_OBJECT_SIZE",
        "max_object_size",
        "size",
        d.DEFAULT_MAX_OBJECT_BYTES,
        "Largest stored (compressed) object this process reads; a bigger one is a miss, "
        "refused before it is downloaded.",
        v.limit,
    )
    max_executable_bytes = Var(
        "MAX_EXECUTABLE_SIZE",
        "max_executable_size",
        "size",
        d.DEFAULT_MAX_EXECUTABLE_BYTES,
        "Largest executable this process inflates an object to; an object must declare its "
        "size before a byte is inflated, so a decompression bomb is refused before any "
        "allocation.",
        v.limit,
    )
    bundle_max_entries = Var(
        "BUNDLE_MAX_ENTRIES",
        "bundle_max_entries",
        "count",
        d.DEFAULT_BUNDLE_MAX_ENTRIES,
        "Most entries `artstore import` accepts in one bundle (`--max-entries`).",
        v.count(10**9),
    )
    bundle_max_bytes: Var[int | None] = Var(
        "BUNDLE_MAX_SIZE",
        "bundle_max_size",
        "size",
        None,
        "Most bytes `artstore import` unpacks one bundle to (`--max-size`).",
        v.limit,
        shown="64x the bundle file's size + 16 MiB",
    )
    signing_key = Var(
        "SIGNING_KEY",
        "signing_key",
        "path",
        None,
        "Path of the `.key` file this writer signs its entries with (never the key itself; "
        "a key file others can read is refused).",
        v.signing_key,
        secret=True,
    )
    trusted_keys = Var(
        "TRUSTED_KEYS",
        "trusted_keys",
        "keys",
        None,
        "Comma-separated `.pub` files or `NAME:BASE64` public keys; when set, only entries "
        "signed by one of them (or by this process's own key) are loaded.",
        v.trusted_keys,
        secret=True,
    )
    require_signatures = Var(
        "REQUIRE_SIGNATURES",
        "require_signatures",
        "boolean",
        False,  # where not given, `resolve` decides by the store's scheme
        "Load only entries signed by a trusted key (or this process's own signing key); "
        "with none trusted, load nothing. `0`: every writer of the bucket decides what "
        "readers run.",
        v.boolean,
        shown="`1` for S3, `0` for a local directory",
    )
    group_readable = Var(
        "GROUP_READABLE",
        "group_readable",
        "boolean",
        False,
        "A local store's new directories and files are readable by their group (0750/0640) "
        "instead of private (0700/0600), to share it read-only.",
        v.boolean,
    )
    single_flight = Var(
        "SINGLE_FLIGHT",
        "single_flight",
        "auto, 1 or 0",
        "auto",
        "One process compiles a key that several miss at once; the others load its result "
        "(`auto`: on for PostgreSQL and for SQLite on a local filesystem; `on`; `off` or "
        "`0`).",
        v.single_flight,
    )
    lease_wait_secs = Var(
        "LEASE_WAIT",
        "lease_wait_secs",
        "seconds",
        None,
        "Longest a writer waits for another's compile before compiling itself (a read-only "
        "process also waits no longer than `lease_reader_wait_secs`).",
        v.seconds(),
        shown="3x the key's last compile time in the index (writers; at least "
        "30 s), else 300, at most `lease_max_hold_secs`",
    )
    lease_ttl_secs = Var(
        "LEASE_TTL",
        "lease_ttl_secs",
        "seconds",
        d.DEFAULT_LEASE_TTL_SECS,
        "A compile lease's lifetime, renewed every third of it; a holder that stops "
        "renewing is taken over after it (at once when it died on the same host).",
        v.seconds(minimum=0.5, maximum=3600),
    )
    lease_max_hold_secs = Var(
        "LEASE_MAX_HOLD",
        "lease_max_hold_secs",
        "seconds",
        d.DEFAULT_LEASE_MAX_HOLD_SECS,
        "No lease (compile or gc) stands further ahead than this: a row expiring later "
        "(forged, or a clock far ahead) is taken over as expired.",
        v.seconds(minimum=1),
    )
    lease_reader_wait_secs = Var(
        "LEASE_READER_WAIT",
        "lease_reader_wait_secs",
        "seconds",
        d.DEFAULT_LEASE_READER_WAIT_SECS,
        "Longest a read-only process (which cannot take a lease over) waits for a writer's "
        "compile before compiling itself: what a lease record, which anyone who may write "
        "the bucket can forge, costs a reader at most per missed key. A record whose holder "
        "is dead (expired, or on this host and gone) costs no wait; each wait is said in "
        "one log line.",
        v.seconds(),
    )
    metrics_port: Var[int | None] = Var(
        "METRICS_PORT",
        "metrics_port",
        "port",
        None,
        "Serve this process's Prometheus metrics on this port (needs the `metrics` extra). "
        "A malformed value turns off metrics alone, with one log line, never the store.",
    )
    metrics_addr = Var(
        "METRICS_ADDR",
        "metrics_addr",
        "address",
        d.DEFAULT_METRICS_ADDR,
        "The address that port is bound to (`0.0.0.0`: every interface).",
    )
    prefetch = Var(
        "PREFETCH",
        "prefetch",
        "auto, 1 or 0",
        None,
        "Load the program's working set (what its last run loaded) in the background while "
        "it imports and traces, deserializing in parallel (see [warm "
        "start](../performance.md#loading-ahead-the-working-set)). `auto`: on for "
        "accelerators (TPU, GPU), off on the CPU, where it would compete with the program's "
        "own tracing for the same cores; `1` on everywhere; `0` off.",
        v.auto_bool,
        shown="`auto`",
    )
    prefetch_max_bytes = Var(
        "PREFETCH_MAX_SIZE",
        "prefetch_max_size",
        "size",
        d.DEFAULT_PREFETCH_BYTES,
        "Bound on the executables loaded ahead and not yet asked for (serialized size): "
        "what a wrong prediction can cost in memory.",
        v.limit,
    )
    program = Var(
        "PROGRAM",
        "program",
        "name",
        None,
        "The name a program's working set is recorded under: give the same name to the same "
        "program started from different paths, and different names to runs of one script "
        "that load different things.",
        v.program,
        shown="the script's resolved path (`sys.argv[0]`)",
    )

    # Not variables: whether the store is the embedded default (no ARTSTORE_URL), and
    # why the metrics settings were refused (metrics are optional: a typo there turns
    # off metrics alone, with one log line, never the store).
    embedded: bool = False
    metrics_error: str | None = None

    @property
    def index_is_server(self) -> bool:
        """A database server (PostgreSQL), whose connections are few and shared by the
        cluster, rather than a SQLite file: the read path never asks it (issue 16)."""
        return not self.index_url.lower().startswith("sqlite")


SETTINGS: tuple[Var[Any], ...] = Settings.rows()

BY_KEYWORD: dict[str, Var[Any]] = {row.keyword: row for row in SETTINGS if row.keyword}


def help_text(keyword: str, what: str = "") -> str:
    """A CLI option's help from the setting's row: `what` (else the row's first sentence),
    then its variable and default, as click shows them."""
    row = BY_KEYWORD[keyword]
    text = what or row.doc.split(". ")[0].rstrip(".") + "."
    return f"{_plain(text)} [env {row.env}; default: {_plain(default_text(row))}]"


def default_text(row: Var[Any]) -> str:
    """The default as the reference says it (markdown): `shown`, else the value as a
    user would write it (`10`, `0.1`, `4GiB`, `10G`, `1`/`0` for booleans)."""
    if row.shown:
        return row.shown
    value = row.default
    if isinstance(value, bool):
        return "`1`" if value else "`0`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, int):
        for units, base in ((("TiB", "GiB", "MiB"), 1024), (("T", "G", "M"), 1000)):
            for power, unit in zip((4, 3, 2), units, strict=True):
                if value >= base**power and value % base**power == 0:
                    return f"`{value // base**power}{unit}`"
    return f"`{value}`"


def _plain(markdown: str) -> str:
    """Markdown as a terminal shows it: links as their text, no backticks."""
    return re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", markdown).replace("`", "")
