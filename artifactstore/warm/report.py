"""The report of one `artstore warm` run: counts added up, text for people, JSON for CI.

`warm -- CMD` builds it from the records its activated processes leave in the
report directory (`aggregate`); `warm MODULE:FUNCTION` from its workers' replies.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from artifactstore.formats.sizes import format_seconds, format_size
from artifactstore.runtime import summary
from artifactstore.warm import NOT_STORED


@dataclass
class Report:
    """What one `artstore warm` run did: outcomes in its processes (`add_event`), never
    what the index says exists."""

    what: str
    added: int = 0  # compiled and stored by a process of this run
    present: int = 0  # loaded from the store and used (a hit), not compiled
    concurrent: int = 0  # compiled, while another process stored the same key
    unloadable: int = 0  # found in the store, but JAX could not load it: compiled
    failed: int = 0
    bytes_uploaded: int = 0
    compile_secs_added: float = 0.0
    compile_secs_present: float = 0.0  # saved in this run: the loads' compile times
    not_stored: dict[str, int] = field(default_factory=dict)  # NOT_STORED reason -> count
    examples: dict[str, str] = field(default_factory=dict)  # a reason's first module (error)
    in_store: dict[str, float] = field(default_factory=dict)  # key -> compile secs
    min_entries: int | None = None
    fingerprints: dict[str, dict[str, Any]] = field(default_factory=dict)
    expected_digest: str | None = None
    problems: list[str] = field(default_factory=list)  # each makes `warm` exit 1
    notes: list[str] = field(default_factory=list)
    items: list[dict[str, Any]] = field(default_factory=list)
    processes: int = 0
    exit_code: int | None = None
    duplicates: int = 0
    elapsed_secs: float = 0.0

    def add_event(self, event: dict[str, Any]) -> None:
        """Count one record of a warming process (`child.Recorder`)."""
        kind, secs = event.get("kind"), float(event.get("compile_secs", 0.0))
        if kind == "fingerprint":
            self.fingerprints[event["digest"]] = {k: v for k, v in event.items() if k != "kind"}
            return
        self.bytes_uploaded += int(event.get("bytes", 0))
        if kind in ("added", "present", "concurrent"):  # the key is in the store now
            self.in_store.setdefault(str(event.get("key")), secs)
        if kind == "added":
            self.added += 1
            self.compile_secs_added += secs
        elif kind == "present":
            self.present += 1
            self.compile_secs_present += secs
        elif kind == "concurrent":
            self.concurrent += 1
        elif kind == "unloadable":
            self.unloadable += 1
        elif kind == "not_stored":
            why = str(event.get("why", "upload"))
            self.not_stored[why] = self.not_stored.get(why, 0) + 1
            error = f" ({event['error']})" if event.get("error") else ""
            self.examples.setdefault(why, f"{event.get('module') or event.get('key')}{error}")

    def conclude(self, min_entries: int | None = None) -> None:
        """The problems of what happened: one line per reason something compiled was not
        stored, and fewer entries stored or loaded than `min_entries` (`--min-entries`)."""
        for why, n in sorted(self.not_stored.items(), key=lambda kv: -kv[1]):
            said = NOT_STORED.get(why, why)
            self.problems.append(
                f"{n} compiled but not stored: {said}; e.g. {self.examples.get(why, '?')}"
            )
        self.min_entries = min_entries
        have = len(self.in_store)
        if min_entries is not None and have < min_entries:
            why = ", ".join(f"{n} {w}" for w, n in self.not_stored.items()) or "none refused"
            self.problems.append(
                f"--min-entries {min_entries}: only {have} entries were stored or loaded by "
                f"this run ({self.added} stored, {self.present} loaded, {self.concurrent} "
                f"stored by another process; not stored: {why})"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "exit_code": self.exit_code,
            "processes": self.processes,
            "added": self.added,
            "present": self.present,
            "concurrent": self.concurrent,
            "unloadable": self.unloadable,
            "not_stored": dict(self.not_stored),
            "failed": self.failed,
            "duplicates": self.duplicates,
            "entries": len(self.in_store),
            "min_entries": self.min_entries,
            "bytes_uploaded": self.bytes_uploaded,
            "compile_secs_added": self.compile_secs_added,
            "compile_secs_present": self.compile_secs_present,
            "compile_secs_saved": self.compile_secs_present,
            "compile_secs_saved_per_process": sum(self.in_store.values()),
            "fingerprints": list(self.fingerprints.values()),
            "expected_fingerprint": self.expected_digest,
            "problems": self.problems,
            "notes": self.notes,
            "items": self.items,
            "elapsed_secs": self.elapsed_secs,
        }

    def render(self) -> str:
        lines = [f"artstore warm: {self.what}, in {format_seconds(self.elapsed_secs)}"]
        if self.exit_code is not None:
            lines.append(f"  {'command exit code':<20}{self.exit_code}")
            lines.append(f"  {'processes':<20}{self.processes} with JAX and the store active")
        dup = f" ({self.duplicates} duplicates skipped)" if self.duplicates else ""
        rows = [
            ("entries added", f"{self.added} (compiled and stored)"),
            ("already present", f"{self.present} (loaded from the store, not compiled){dup}"),
        ]
        if self.concurrent:
            rows.append(("stored by another", f"{self.concurrent} (compiled here meanwhile)"))
        if self.unloadable:
            rows.append(("not loadable", f"{self.unloadable} (found, JAX could not load them)"))
        if self.not_stored:
            whys = ", ".join(f"{w} {n}" for w, n in self.not_stored.items())
            rows.append(("not stored", f"{sum(self.not_stored.values())} (compiled: {whys})"))
        if self.items:
            rows.append(("failed", str(self.failed)))
        rows += [
            ("bytes uploaded", format_size(self.bytes_uploaded)),
            (
                "compile time saved",
                f"{format_seconds(self.compile_secs_present)} in this run (loads); "
                f"{format_seconds(sum(self.in_store.values()))} per fresh process on this "
                f"target ({len(self.in_store)} entries stored or loaded)",
            ),
        ]
        lines += [f"  {k:<20}{v}" for k, v in rows]
        if not self.fingerprints:
            lines.append(f"  {'fingerprint':<20}(nothing compiled or loaded)")
        for fp in self.fingerprints.values():
            mark = " (the expected target)" if fp["digest"] == self.expected_digest else ""
            lines.append(f"  {'fingerprint':<20}{describe_fingerprint(fp)}{mark}")
        for item in self.items:
            if item["status"] == "failed":
                lines.append(f"  FAILED {item['name']}: {item['error']}")
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)


def describe_fingerprint(fp: dict[str, Any]) -> str:
    return (
        f"{fp['digest'][:12]}: {fp['platform']} {fp['device_kind']!r} x{fp['device_count']}, "
        f"jax {fp['jax_version']}, jaxlib {fp['jaxlib_version']}, {fp['cpu_arch']}"
    )


def check_warmed_target(report: Report, expected: dict[str, Any] | None) -> None:
    """Mark `expected` in the report; a problem if what was warmed is all for other targets."""
    if expected is None:
        return
    report.expected_digest = expected["digest"]
    if report.fingerprints and expected["digest"] not in report.fingerprints:
        report.problems.append(
            f"nothing was warmed for the expected target fingerprint {expected['digest'][:12]}"
        )


# -- the records of `warm -- CMD`'s processes ---------------------------------
def aggregate(report_dir: Path, *, what: str) -> Report:
    """Add up what the activated processes left in `report_dir` (see `child.activate`).

    Per process: `PID.started` when it activated, `PID.events` (one JSON line per
    entry stored or found, written as it happens) and `PID.json` at a normal exit
    (counters, whether uploads finished). A process killed before its exit
    leaves no `PID.json`, but what it stored is in its events.
    """
    report = Report(what=what)
    pids = sorted({p.name.split(".")[0] for p in report_dir.glob("*.started")}, key=int)
    report.processes = len(pids)
    silent = []
    for pid in pids:
        started = _read_json(report_dir / f"{pid}.started") or {}
        final = _read_json(report_dir / f"{pid}.json")
        argv = shlex.join(started.get("argv", []))[:80]
        gated = report.not_stored.get("write gate", 0)
        for event in _read_events(report_dir / f"{pid}.events"):
            report.add_event(event)
        if final is None:
            silent.append(pid)
            continue
        if not final.get("active"):
            report.problems.append(
                f"pid {pid} ({argv}): the store was unavailable; its "
                "compiles were not stored (see its warning above)"
            )
        elif (
            summary.Summary.of([final.get("stats") or {}]).mismatched  # as `artstore run` says
            and report.not_stored.get("write gate", 0) == gated
        ):  # refused where no put saw it (a named build, a record): said all the same
            report.problems.append(f"pid {pid} ({argv}): {NOT_STORED['write gate']}")
        if not final.get("flushed", True):
            report.problems.append(
                f"pid {pid} ({argv}): uploads did not finish within "
                "ARTSTORE_FLUSH_TIMEOUT; some entries were not stored"
            )
    if silent:
        report.notes.append(
            f"{len(silent)} process(es) (pid {', '.join(silent[:5])}) were ended before a "
            "normal exit (e.g. multiprocessing's Pool.terminate): what they stored is counted; "
            "a compile in progress when they ended was lost"
        )
    return report


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_events(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:  # a line cut short by a kill
            continue
    return events
