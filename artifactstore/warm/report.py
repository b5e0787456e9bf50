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


@dataclass
class Report:
    """What one `artstore warm` run did."""

    what: str
    added: int = 0
    present: int = 0
    failed: int = 0
    bytes_uploaded: int = 0
    compile_secs_added: float = 0.0
    compile_secs_present: float = 0.0
    fingerprints: dict[str, dict[str, Any]] = field(default_factory=dict)
    expected_digest: str | None = None
    problems: list[str] = field(default_factory=list)  # each makes `warm` exit 1
    notes: list[str] = field(default_factory=list)
    items: list[dict[str, Any]] = field(default_factory=list)
    processes: int = 0
    exit_code: int | None = None
    duplicates: int = 0
    elapsed_secs: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "exit_code": self.exit_code,
            "processes": self.processes,
            "added": self.added,
            "present": self.present,
            "failed": self.failed,
            "duplicates": self.duplicates,
            "bytes_uploaded": self.bytes_uploaded,
            "compile_secs_added": self.compile_secs_added,
            "compile_secs_present": self.compile_secs_present,
            "compile_secs_saved_per_process": self.compile_secs_added + self.compile_secs_present,
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
        saved = self.compile_secs_added + self.compile_secs_present
        rows = [
            ("entries added", f"{self.added} (compiled and stored)"),
            ("already present", f"{self.present} (loaded, not compiled){dup}"),
            ("bytes uploaded", format_size(self.bytes_uploaded)),
            (
                "compile time saved",
                f"{format_seconds(saved)} per fresh process on this "
                f"target ({format_seconds(self.compile_secs_added)} added now)",
            ),
        ]
        if self.items:
            rows.insert(2, ("failed", str(self.failed)))
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
        put_errors = []
        for event in _read_events(report_dir / f"{pid}.events"):
            kind = event.get("kind")
            if kind == "fingerprint":
                report.fingerprints[event["digest"]] = {
                    k: v for k, v in event.items() if k != "kind"
                }
            elif kind in ("added", "present"):
                report.bytes_uploaded += int(event.get("bytes", 0))
                if kind == "added":
                    report.added += 1
                    report.compile_secs_added += float(event.get("compile_secs", 0.0))
                else:
                    report.present += 1
                    report.compile_secs_present += float(event.get("compile_secs", 0.0))
            elif kind == "put_error":
                put_errors.append(f"{event.get('module')}: {event.get('error')}")
        if put_errors:
            report.problems.append(
                f"pid {pid} ({argv}): {len(put_errors)} upload(s) failed, "
                f"e.g. {put_errors[0]} (writer credentials?)"
            )
        if final is None:
            silent.append(pid)
            continue
        if not final.get("active"):
            report.problems.append(
                f"pid {pid} ({argv}): the store was unavailable; its "
                "compiles were not stored (see its warning above)"
            )
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
