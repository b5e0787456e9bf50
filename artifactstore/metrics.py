"""Prometheus metrics: a process's counters and histograms, and the index's gauges.

Opt-in, with the optional `prometheus-client` (`pip install 'artifactstore[metrics]'`):

- `ARTSTORE_METRICS_PORT=N` (or `configure(metrics_port=N)`): this process serves its
  metrics for scraping on N, bound to `ARTSTORE_METRICS_ADDR` (default 127.0.0.1), once
  per process. They go into prometheus_client's default registry, so a program that
  already serves its own metrics serves ours too, port or not.
- `PROMETHEUS_MULTIPROC_DIR=DIR` (prometheus_client's multiprocess mode): every process
  writes its counters to files in DIR, and one collector adds them up, so a fleet of
  short processes is counted as one: `artstore metrics --multiprocess-dir DIR` (for a
  textfile collector), or a long-running process with a port, which then serves the sum.

A process that does neither never imports prometheus_client (nor this module); one that
asks without it installed logs one line and runs as before. Metrics never break the
program: a failure to count is logged at debug level.

Every event the process counts (`process.counters.Counters.add`) reaches `Recorder.counted`,
which feeds the metric formats.counters names for it; the session reports the seconds
of loads and compiles (the histograms). `IndexGauges` turns what `artstore metrics`
read from the index into metric families. Names and labels are listed below:
`infra/grafana/artifactstore.json` and the tests check against them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from artifactstore.errors import one_line
from artifactstore.formats.counters import NAMES

if TYPE_CHECKING:
    from artifactstore.config import Settings

log = logging.getLogger("artifactstore")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
INSTALL_HINT = "pip install 'artifactstore[metrics]'"

# -- what a process exports (name without the _total a counter gets) -> labels
COUNTERS: dict[str, tuple[str, ...]] = {
    "artstore_hits": ("namespace", "tier"),  # tier: local (this host's tier) or store
    "artstore_misses": ("namespace",),  # compiles the store could have served
    "artstore_quick_compiles": ("namespace",),  # under ARTSTORE_MIN_COMPILE_SECS: not misses
    "artstore_compiles": ("namespace",),  # XLA compiles routed through the store
    "artstore_stored": ("namespace",),  # entries this process created
    "artstore_bytes_fetched": ("namespace",),  # object bytes read from the object store
    "artstore_bytes_uploaded": ("namespace",),  # object bytes written to it
    "artstore_lease_waits": ("namespace",),  # compiles that waited on another's lease
    "artstore_lease_takeovers": ("namespace",),  # expired leases taken over
    "artstore_errors": ("namespace", "kind"),  # see ERROR_KINDS
}
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "artstore_load_seconds": ("namespace",),  # fetch (tier or store) + deserialize
    "artstore_compile_seconds": ("namespace",),  # XLA compile of a miss
}
LOAD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
COMPILE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

# The process's counter names (formats.counters) -> the metric each feeds, and its
# second label's value (a hit's tier; an error's kind: the name, unless it says other).
FEEDS: dict[str, tuple[str, str | None]] = {
    name: (e.metric, (e.label or name) if len(COUNTERS[e.metric]) > 1 else None)
    for name, e in NAMES.items()
    if e.metric is not None
}
# Names -> artstore_errors_total{kind}. A refusal whose key is then compiled is a miss
# too: artstore_misses_total counts the compile.
ERROR_KINDS: dict[str, str] = {
    name: str(label) for name, (metric, label) in FEEDS.items() if metric == "artstore_errors"
}

# -- what `artstore metrics` prints (from the index only)
INDEX_GAUGES: dict[str, str] = {
    "artstore_index_entries": "Entries in the namespace.",
    "artstore_index_entry_bytes": "Bytes of the namespace's entries (sum of their sizes).",
    "artstore_index_objects": "Objects the index records for the namespace.",
    "artstore_index_object_bytes": "Bytes of those objects.",
    "artstore_index_entry_hits": "Hits of the entries held now (evicted entries take theirs).",
    "artstore_index_hits": "Hits of all time, evicted entries' included (as `artstore stats`).",
    "artstore_index_misses": "Compiles the store could have served, quick ones not counted "
    "(`artstore stats`' misses; events{event=misses} counts every lookup that found nothing).",
    "artstore_index_compile_seconds_saved": "Sum of hits x compile seconds of entries held now.",
    "artstore_index_oldest_access_age_seconds": "Seconds since the least recently used entry "
    "was last used (namespaces with entries).",
    "artstore_quota_bytes": "The namespace's quota (namespaces with one).",
    "artstore_quota_used_bytes": "Bytes the quota counts: distinct objects of its entries.",
    "artstore_quota_use_ratio": "Quota use: used bytes / quota bytes.",
}
INDEX_COUNTERS: dict[str, tuple[str, ...]] = {
    # The index's persistent counters table (misses, corrupt, unsigned, ...), by name.
    "artstore_index_events": ("namespace", "event"),
}


def exported_names() -> set[str]:
    """Every sample name a process or `artstore metrics` can expose (for the dashboard)."""
    names = {f"{n}_total" for n in (*COUNTERS, *INDEX_COUNTERS)}
    for name in HISTOGRAMS:
        names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names | set(INDEX_GAUGES)


def wanted(settings: Settings) -> bool:
    """Whether this process asked for metrics (a port, or the multiprocess directory)."""
    return settings.metrics_port is not None or bool(os.environ.get(MULTIPROC_ENV))


# -- a process's metrics -----------------------------------------------------------
class _Metrics:
    """The process's metric objects, made once, in prometheus_client's default registry
    (or `registry`, for tests)."""

    def __init__(self, prom: Any, registry: Any = None) -> None:
        where = {"registry": registry} if registry is not None else {}
        self.counters = {
            name: prom.Counter(name, _DOCS[name], list(labels), **where)
            for name, labels in COUNTERS.items()
        }
        self.load = prom.Histogram(
            "artstore_load_seconds",
            _DOCS["artstore_load_seconds"],
            ["namespace"],
            buckets=LOAD_BUCKETS,
            **where,
        )
        self.compile = prom.Histogram(
            "artstore_compile_seconds",
            _DOCS["artstore_compile_seconds"],
            ["namespace"],
            buckets=COMPILE_BUCKETS,
            **where,
        )


_DOCS = {
    "artstore_hits": "Executables loaded instead of compiled, by tier (local: this host's "
    "tier; store: the shared store).",
    "artstore_misses": "Compiles the store could have served (quick ones are not misses).",
    "artstore_quick_compiles": "Compiles under ARTSTORE_MIN_COMPILE_SECS: never stored.",
    "artstore_compiles": "XLA compiles of programs routed through the store.",
    "artstore_stored": "Entries this process stored.",
    "artstore_bytes_fetched": "Object bytes read from the object store.",
    "artstore_bytes_uploaded": "Object bytes written to the object store.",
    "artstore_lease_waits": "Compiles that waited for another process's compile lease.",
    "artstore_lease_takeovers": "Expired compile leases taken over.",
    "artstore_errors": "Store errors and refusals, by kind.",
    "artstore_load_seconds": "Seconds to fetch and deserialize a stored executable.",
    "artstore_compile_seconds": "Seconds XLA took to compile a miss.",
}

_lock = threading.Lock()
_metrics: _Metrics | None = None
_unavailable = False  # prometheus_client missing: said once
_served: tuple[str, int] | None = None  # the port asked for first (served or not)


class Recorder:
    """A session's view of the process's metrics: its namespace as the label."""

    def __init__(self, metrics: _Metrics, namespace: str) -> None:
        self._m = metrics
        self.namespace = namespace
        self._failed = False

    def counted(self, name: str, value: float = 1, fingerprint: str | None = None) -> None:
        """An event the process counted (`Counters.add`): onto the metric formats.counters
        names for it, if any."""
        feeds = FEEDS.get(name)
        if feeds is None or value <= 0:
            return
        metric, label = feeds
        labels = (self.namespace,) if label is None else (self.namespace, label)
        try:
            self._m.counters[metric].labels(*labels).inc(value)
        except Exception as exc:
            self._fail(exc)

    def loaded(self, secs: float) -> None:
        self._guard(lambda: self._m.load.labels(self.namespace).observe(max(secs, 0.0)))

    def compiled(self, secs: float) -> None:
        """A compile took `secs` (counted as a miss or a quick one by `counted`)."""
        self._guard(lambda: self._m.compile.labels(self.namespace).observe(max(secs, 0.0)))

    def _guard(self, record: Callable[[], None]) -> None:
        try:
            record()
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        if not self._failed:
            self._failed = True
            log.debug("artifactstore: metrics not recorded: %s", one_line(exc))


def enable(settings: Settings) -> Recorder | None:
    """This process's metrics for `settings.namespace`, served on `settings.metrics_port`
    (once per process); None, after one log line, without prometheus-client."""
    global _metrics, _unavailable
    with _lock:
        if _unavailable:
            return None
        multiproc = os.environ.get(MULTIPROC_ENV) or None
        if multiproc is not None and not os.path.isdir(multiproc):
            _unavailable = True
            log.warning(
                "artifactstore: metrics off: %s=%s is not a directory", MULTIPROC_ENV, multiproc
            )
            return None
        try:
            import prometheus_client as prom
        except ImportError:
            _unavailable = True
            log.warning(
                "artifactstore: metrics off: prometheus-client is not installed (%s)",
                INSTALL_HINT,
            )
            return None
        try:
            if _metrics is None:
                _metrics = _Metrics(prom)
            recorder = Recorder(_metrics, settings.namespace)
        except Exception as exc:  # e.g. names taken in the default registry by someone else
            _unavailable = True
            log.warning("artifactstore: metrics off: %s", one_line(exc))
            return None
        if settings.metrics_port is not None:
            _serve(prom, settings.metrics_addr, settings.metrics_port, multiproc)
        return recorder


def _serve(prom: Any, addr: str, port: int, multiproc: str | None) -> None:
    """Start the scrape endpoint once per process; a failure is one line, never an error."""
    global _served
    if _served is not None:
        if _served != (addr, port):
            log.debug("artifactstore: metrics already served on %s:%d", *_served)
        return
    _served = (addr, port)
    try:
        registry = prom.REGISTRY
        if multiproc is not None:  # serve the sum of every process writing the directory
            from prometheus_client import multiprocess

            registry = prom.CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=multiproc)  # type: ignore[no-untyped-call]
        prom.start_http_server(port, addr=addr, registry=registry)
    except Exception as exc:
        log.warning(
            "artifactstore: metrics not served on %s:%d (%s); set ARTSTORE_METRICS_PORT to "
            "a free port",
            addr,
            port,
            one_line(exc),
        )
        return
    log.debug("artifactstore: metrics served on http://%s:%d/metrics", addr, port)


# -- the index's gauges (`artstore metrics`) ---------------------------------------
@dataclass
class NamespaceFigures:
    """What the index holds for one namespace, as `artstore metrics` reports it."""

    namespace: str
    entries: int = 0
    entry_bytes: int = 0
    objects: int = 0
    object_bytes: int = 0
    entry_hits: float = 0.0
    compile_secs_saved: float = 0.0
    oldest_access_age_secs: float | None = None  # None: no entries
    quota_bytes: int | None = None  # None: no quota
    quota_used_bytes: int = 0
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def hits(self) -> float:
        """As `artstore stats` counts them: entries held now and evicted ones."""
        return self.entry_hits + self.counters.get("evicted_hits", 0)

    @property
    def misses(self) -> int:
        """As `artstore stats` counts them: lookups that missed less quick compiles."""
        below = self.counters.get("misses_below_threshold", 0)
        return max(self.counters.get("misses", 0) - below, 0)


class IndexGauges:
    """A prometheus_client collector over figures already read from the index."""

    def __init__(self, figures: Iterable[NamespaceFigures]) -> None:
        self.figures = list(figures)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        gauges = {
            name: GaugeMetricFamily(name, doc, labels=["namespace"])
            for name, doc in INDEX_GAUGES.items()
        }
        events = CounterMetricFamily(
            "artstore_index_events",
            "The index's persistent event counters (misses, corrupt, unsigned, ...).",
            labels=list(INDEX_COUNTERS["artstore_index_events"]),
        )
        for f in self.figures:
            ns = [f.namespace]
            gauges["artstore_index_entries"].add_metric(ns, f.entries)
            gauges["artstore_index_entry_bytes"].add_metric(ns, f.entry_bytes)
            gauges["artstore_index_objects"].add_metric(ns, f.objects)
            gauges["artstore_index_object_bytes"].add_metric(ns, f.object_bytes)
            gauges["artstore_index_entry_hits"].add_metric(ns, f.entry_hits)
            gauges["artstore_index_hits"].add_metric(ns, f.hits)
            gauges["artstore_index_misses"].add_metric(ns, f.misses)
            gauges["artstore_index_compile_seconds_saved"].add_metric(ns, f.compile_secs_saved)
            if f.oldest_access_age_secs is not None:
                age = max(f.oldest_access_age_secs, 0.0)
                gauges["artstore_index_oldest_access_age_seconds"].add_metric(ns, age)
            if f.quota_bytes is not None:
                gauges["artstore_quota_bytes"].add_metric(ns, f.quota_bytes)
                gauges["artstore_quota_used_bytes"].add_metric(ns, f.quota_used_bytes)
                ratio = f.quota_used_bytes / f.quota_bytes if f.quota_bytes else 0.0
                gauges["artstore_quota_use_ratio"].add_metric(ns, ratio)
            for name, value in sorted(f.counters.items()):
                events.add_metric([f.namespace, name], value)
        yield from gauges.values()
        yield events


def exposition(figures: Iterable[NamespaceFigures], multiprocess_dir: str | None = None) -> bytes:
    """The text exposition format of the index's figures, and with `multiprocess_dir`,
    of the processes that wrote there (added up by prometheus_client)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(IndexGauges(figures))
    if multiprocess_dir is not None:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry, path=multiprocess_dir)  # type: ignore[no-untyped-call]
    return bytes(generate_latest(registry))
