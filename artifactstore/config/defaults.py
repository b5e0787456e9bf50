"""The defaults of every setting, with why each is what it is.

Apart from the parsing so that the generated configuration reference and the code
read the same numbers (`docs/hooks/reference.py` shows each `DEFAULT_*`).
"""

from __future__ import annotations

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
# A read-only reader cannot take a silent holder's lease over, and anyone who may write
# the bucket can write a lease record: it waits for a writer's compile this long at most,
# then compiles (a few seconds: what a lost wait may cost each missed key, never a minute).
DEFAULT_LEASE_READER_WAIT_SECS = 5.0
SINGLE_FLIGHT_MODES = ("auto", "on", "off")
# Executables a process loads ahead of JAX's requests (its working set, issue 31) are held
# until claimed: at most this much serialized executable at once, a bound on what a wrong
# prediction costs (a few large TPU programs: tens to hundreds of MB each).
DEFAULT_PREFETCH_BYTES = 1024**3
# Where a process serves its metrics (ARTSTORE_METRICS_PORT): this host only, unless asked.
DEFAULT_METRICS_ADDR = "127.0.0.1"
# Seconds: any bound beyond a day is a typo (and `inf` would overflow the waits it bounds).
MAX_SECS = 86400.0
