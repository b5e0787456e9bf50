"""How commands print: tables, key/value listings and JSON, all through here.

Every string printed through here is redacted (`artifactstore.redact`): values such as
a store's description or a doctor check quote URLs, and URLs carry passwords.

`artstore gc` streams its removals instead (`gc_output`), so that a dry run over
millions of entries never holds them in memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from artifactstore.redact import redact

if TYPE_CHECKING:
    from artifactstore.formats.fingerprint import Fingerprint

# What `artstore fingerprint` lists before the CPU features, in the order it always has:
# `fingerprint.FIELDS` puts device facts before platform_version and the CPU features
# before `os`, and `version` is not shown.
_FINGERPRINT_ROWS = (
    "digest",
    "platform",
    "platform_version",
    "device_kind",
    "device_count",
    "jax_version",
    "jaxlib_version",
    "cpu_arch",
    "os",
)


F = TypeVar("F", bound=Callable[..., Any])


def json_option(help: str = "Print JSON.") -> Callable[[F], F]:
    """The `--json` flag (parameter `as_json`) of every command that has one."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def fetch_jobs_option(help: str = "Objects fetched in parallel.") -> Callable[[F], F]:
    """The `-j/--jobs` of the commands that fetch objects (`pull`, `native pull`)."""
    return click.option(
        "-j", "--jobs", type=click.IntRange(1, 64), default=8, show_default=True, help=help
    )


def print_json(data: Any, *, sort_keys: bool = False) -> None:
    """What every `--json` prints: one indented document, its strings redacted."""
    click.echo(json.dumps(_redacted(data), indent=2, sort_keys=sort_keys))


def _redacted(data: Any) -> Any:
    """`data` with every string in it redacted (before JSON escapes them, which would
    hide a value's end from the patterns)."""
    if isinstance(data, str):
        return redact(data)
    if isinstance(data, dict):
        return {key: _redacted(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_redacted(value) for value in data]
    return data


def when(dt: datetime) -> str:
    """How long ago, for a person: "just now", "5 min ago", "3 h ago", or the date."""
    delta = (datetime.now(UTC) - dt).total_seconds()
    if delta < 60:
        return "just now"
    if delta < 3600:
        return f"{int(delta // 60)} min ago"
    if delta < 86400:
        return f"{int(delta // 3600)} h ago"
    return dt.strftime("%Y-%m-%d")


def short_keys(keys: list[str], at_least: int = 12) -> dict[str, str]:
    """Each key's shortest prefix (of `at_least` or more) that no other of `keys` shares:
    torch-xla's keys begin with their platform's digits (formats.torchxla), so their
    first 12 are alike, and a row must show what `artstore rm` can be given."""
    ordered = sorted(set(keys))
    out = {}
    for i, key in enumerate(ordered):
        near = [ordered[j] for j in (i - 1, i + 1) if 0 <= j < len(ordered)]
        shared = max((_common(key, other) for other in near), default=0)
        out[key] = key[: max(at_least, shared + 1)]
    return out


def _common(a: str, b: str) -> int:
    """How many leading characters `a` and `b` share."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def safe(value: object) -> str:
    """`value` as text that cannot drive the terminal: index fields are written by anyone
    with write access, and an escape sequence in a module or host name would otherwise
    reach the operator's terminal. Control characters are shown as Python escapes."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """Columns two spaces apart under a dashed rule; columns in `right` right-aligned."""
    right = right or set()
    rows = [[safe(c) for c in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def fmt(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([fmt(headers), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def print_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> None:
    click.echo(redact(table(headers, rows, right)))


def print_fields(pairs: Iterable[tuple[str, object]]) -> None:
    """`name: value` lines, values aligned one space after the longest name."""
    pairs = list(pairs)
    width = max(len(name) for name, _ in pairs) + 2
    for name, value in pairs:
        click.echo(f"{name + ':':<{width}}{safe(redact(str(value)))}")


def fingerprint_fields(fp: Fingerprint) -> list[tuple[str, object]]:
    """The rows `artstore fingerprint` lists for `fp`."""
    data = {**fp.to_dict(), "digest": fp.digest}
    rows: list[tuple[str, object]] = [(name, data[name]) for name in _FINGERPRINT_ROWS]
    rows.append(("cpu_features", " ".join(fp.cpu_features) or "(none detected)"))
    return rows
