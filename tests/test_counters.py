"""The process's one counting object (process.counters) and its one table of names
(formats.counters): every name counted is declared there, the snapshot is the documented
flat view, and the names the index, the journals and the summaries use derive from it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from artifactstore.formats import codec, journal, usage
from artifactstore.formats.counters import DEPRECATED, NAMES, snapshot, stored_name
from artifactstore.process.counters import Counters
from artifactstore.runtime import summary
from artifactstore.store.account import Pending

PACKAGE = Path(__file__).resolve().parents[1] / "artifactstore"


def _counted_literally() -> dict[str, str]:
    """Each name the package passes as a literal to a counters object's `add` (or the
    load ahead's `_count`), with where."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            receiver = ast.unparse(node.func.value)
            counting = (node.func.attr == "add" and receiver.endswith("counters")) or (
                node.func.attr == "_count" and path.name == "prefetch.py"
            )
            if counting and node.args and isinstance(node.args[0], ast.Constant):
                found[str(node.args[0].value)] = f"{path.name}:{node.lineno}"
    return found


def test_every_name_counted_is_declared() -> None:
    counted = _counted_literally()
    assert len(counted) > 40  # the scan finds the counting calls
    assert {"store_hits", "tier_hits", "loads", "quick_compiles", "prefetch_used"} <= set(counted)
    undeclared = {name: where for name, where in counted.items() if name not in NAMES}
    assert not undeclared, f"declare these in formats/counters.py: {undeclared}"


def test_names_counted_by_pattern_are_declared() -> None:
    """The tier counts `tier_<reason>` of a refused signature; the session each backend's
    `breaker_opened_<backend>`; a store's lookup counts the reason it missed."""
    refusals = [c for c in vars(codec).values() if isinstance(c, type)]
    reasons = {c.reason for c in refusals if issubclass(c, codec.SignatureRefused)}
    assert {"unsigned", "untrusted_key", "bad_signature", "secret_key_listed"} <= reasons
    assert not {name for r in reasons for name in (r, f"tier_{r}")} - set(NAMES)
    assert NAMES["breaker_opened"].sum_of == ("breaker_opened_index", "breaker_opened_object_store")
    assert set(NAMES["hits"].sum_of) == {"store_hits", "tier_hits", "quick_loads"}
    assert all(part in NAMES for entry in NAMES.values() for part in entry.sum_of)


def test_the_index_names_derive_from_the_table() -> None:
    """What a store writes to its index and journals, and under which name, is declared
    once: every name of the index's totals and usage rows is some counter's `stored_as`."""
    stored = {entry.stored_as for entry in NAMES.values() if entry.stored_as is not None}
    assert stored == (usage.TOTALS | set(usage.FIELDS)) - {"compile_secs_saved"}
    assert journal.COUNTERS <= stored
    assert stored_name("lookups_missed") == "misses" and stored_name("misses") is None
    assert stored_name("quick_compiles") == "below_threshold"


def test_a_store_sends_its_index_the_stored_names_only() -> None:
    counters, pending = Counters(), Pending()
    counters.observe(pending.counted)
    counters.add("misses")  # compiles the store could have served: the process's alone
    counters.add("lookups_missed", fingerprint="fp")
    counters.add("quick_compiles", 2, fingerprint="fp")
    counters.add("store_hits", fingerprint="fp")
    counters.add("tier_hits")
    counts, rows = pending.take()
    assert dict(counts) == {"misses": 1, "below_threshold": 2}
    assert list(rows.values()) == [{"misses": 1, "below_threshold": 2, "hits": 1}]


def test_the_snapshot_is_flat_and_documented() -> None:
    counters = Counters()
    counters.state("active", lambda: 1)
    counters.add("store_hits", 2)
    counters.add("tier_hits")
    counters.add("quick_compiles", 3)
    counters.add("compile_ms", 1.4)
    counters.add("compile_ms", 1.4)
    counters.add("breaker_opened_index")
    got = counters.snapshot()
    assert (got["hits"], got["store_hits"], got["tier_hits"]) == (3, 2, 1)
    assert got["compile_ms"] == 3 and got["active"] == 1 and got["breaker_opened"] == 1
    assert (got["loads"], got["compiles"], got["misses"], got["lookups_missed"]) == (0, 0, 0, 0)
    assert got["below_threshold"] == got["quick_compiles"] == 3  # 0.3's name, for now
    assert set(got) - set(DEPRECATED) <= set(NAMES)
    assert "eligible_misses" in got and "breaker_refused" not in got  # never counted
    assert snapshot({}, {}) == {name: 0 for name, entry in NAMES.items() if entry.always} | {
        "eligible_misses": 0
    }


def test_an_observer_that_fails_breaks_no_count() -> None:
    def broken(name: str, n: float, fingerprint: str | None) -> None:
        raise RuntimeError("metrics down")

    counters = Counters()
    counters.observe(broken)
    counters.add("tier_hits")
    assert counters.snapshot()["tier_hits"] == 1


def test_the_summaries_read_declared_names() -> None:
    """The `artstore run` and pytest summaries add up process_stats() records by name."""
    source = Path(summary.__file__).read_text()
    read = set(re.findall(r'stats\.get\("([a-z_]+)"', source))
    assert {"loads", "misses", "quick_compiles", "stored", "active"} <= read
    assert read <= set(NAMES)
