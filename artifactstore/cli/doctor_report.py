"""`artstore doctor`'s rows, its verdict and exit code, and how they are printed.

The exit code says whether programs here would use the store as configured: 0 yes;
1 no (a `blocking` row failed: they compile as if there were no store; an `off` row: the
environment was meant to turn the store on and does not, the verdict is "off") or degraded
(a row that `degrades`: they use it, but not as configured, e.g. every write refused).
The table fits 100 columns: long details wrap under their column.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import click

from artifactstore.cli.render import safe
from artifactstore.redact import redact

Status = Literal["ok", "fail", "warn", "skip"]
WIDTH = 100
_SHOWN = {"ok": "ok", "fail": "FAIL", "warn": "warn", "skip": "-"}


@dataclass
class Check:
    """One row: a failed `blocking` check means the store would not be used; a
    `degrades` row (any status but ok) that it would be used, but not as configured."""

    label: str
    status: Status
    detail: str
    verdict: str = ""  # for a failure: what is wrong and what to do, for the verdict line
    blocking: bool = True
    data: dict[str, Any] = field(default_factory=dict)
    degrades: bool = False
    off: bool = False  # failed: nothing turns the store on here, the verdict is this row's

    @property
    def blocks(self) -> bool:
        return self.blocking and self.status == "fail"

    @property
    def degraded(self) -> bool:
        return self.degrades and self.status != "ok"


@dataclass
class Report:
    checks: dict[str, Check]
    ok: bool  # programs would use the store as configured: exit 0
    verdict: str
    used: Literal["read-write", "read-only", "no"] = "no"

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "used": self.used,
            "verdict": self.verdict,
            "checks": {
                name: {
                    "label": c.label,
                    "status": c.status,
                    "detail": c.detail,
                    "blocking": c.blocking,
                    "degrades": c.degraded,
                    **c.data,
                }
                for name, c in self.checks.items()
            },
        }


def conclude(checks: dict[str, Check], read_only: bool, where: str) -> Report:
    """The verdict and exit code of `checks`; `where`: the store, as the verdict names it."""
    off = [c.verdict for c in checks.values() if c.off and c.status == "fail"]
    if off:
        return Report(checks, False, _scrub("; ".join(off)))
    blocked = _unique(c.verdict or f"{c.label}: {c.detail}" for c in checks.values() if c.blocks)
    pending = [c for c in checks.values() if c.blocking and c.status == "skip"]
    degraded = _unique(c.verdict or f"{c.label}: {c.detail}" for c in checks.values() if c.degraded)
    if blocked or pending:
        why = blocked or [f"{c.label} not checked" for c in pending]
        return Report(checks, False, _scrub("the store is not used: " + "; ".join(why)))
    stores = checks.get("access") is not None and checks["access"].data.get("stores", False)
    used: Literal["read-write", "read-only"] = "read-write" if stores else "read-only"
    if degraded:
        verdict = f"the store would be used {used} ({where}), not as configured: " + "; ".join(
            degraded
        )
        return Report(checks, False, _scrub(verdict), used)
    mode = " (read-only)" if read_only else ""
    return Report(checks, True, _scrub(f"the store would be used: {where}{mode}"), used)


def _unique(reasons: Iterable[str]) -> list[str]:
    """Each reason once: the object store and the index of one unreadable directory
    fail for one cause (told apart by what follows their label)."""
    seen: set[str] = set()
    kept = []
    for reason in reasons:
        cause = reason.split(": ", 1)[-1]
        if cause not in seen:
            seen.add(cause)
            kept.append(reason)
    return kept


def _scrub(text: str) -> str:
    """A detail or verdict fit for the report: secrets masked, on one line."""
    return " ".join(redact(text).split())


def scrub(checks: dict[str, Check]) -> None:
    for check in checks.values():
        check.detail, check.verdict = _scrub(check.detail), _scrub(check.verdict)


def render(report: Report, width: int = WIDTH) -> str:
    """The table (CHECK, STATUS, DETAIL; details wrapped) and the verdict, in `width`."""
    rows = [(safe(c.label), _SHOWN[c.status], safe(c.detail)) for c in report.checks.values()]
    w0 = max(len("CHECK"), *(len(r[0]) for r in rows))
    w1 = max(len("STATUS"), *(len(r[1]) for r in rows))
    w2 = max(20, width - w0 - w1 - 4)
    lines = [f"{'CHECK':<{w0}}  {'STATUS':<{w1}}  DETAIL", f"{'-' * w0}  {'-' * w1}  {'-' * w2}"]
    for label, status, detail in rows:
        wrapped = _wrap(detail, w2) or [""]
        lines.append(f"{label:<{w0}}  {status:<{w1}}  {wrapped[0]}".rstrip())
        lines.extend(" " * (w0 + w1 + 4) + more for more in wrapped[1:])
    verdict = textwrap.wrap(
        f"verdict: {safe(report.verdict)}", width, subsequent_indent=" " * 9, break_on_hyphens=False
    )
    return redact("\n".join([*lines, *verdict]))


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, break_on_hyphens=False)


def echo(report: Report) -> None:
    click.echo(render(report))
