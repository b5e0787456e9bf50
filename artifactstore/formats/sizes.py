"""Human-readable byte sizes, durations and counts: parsed from options, formatted for display."""

from __future__ import annotations

import re

from artifactstore.errors import ConfigError

_UNITS: dict[str, int] = {
    "": 1,
    "B": 1,
    "K": 1000,
    "KB": 1000,
    "M": 1000**2,
    "MB": 1000**2,
    "G": 1000**3,
    "GB": 1000**3,
    "T": 1000**4,
    "TB": 1000**4,
    "P": 1000**5,
    "PB": 1000**5,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
    "TIB": 1024**4,
    "PIB": 1024**5,
}

MAX_SIZE = 2**63 - 1  # what the index can store (BIGINT)
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse `500G`, `1.5TiB`, `800MB`, `1024` into bytes (decimal and binary units)."""
    match = _SIZE_RE.match(text)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigError(
            f"invalid size {text!r}: use a non-negative number with an optional unit "
            "(B, K/KB, M/MB, G/GB, T/TB, P/PB or KiB, MiB, GiB, TiB, PiB), e.g. 500G or 1.5TiB"
        )
    assert unit is not None
    value = int(float(match.group(1)) * _UNITS[unit])
    if value > MAX_SIZE:
        raise ConfigError(f"invalid size {text!r}: at most 8 EiB (9223372036854775807 bytes)")
    return value


def format_size(num: float) -> str:
    """Binary units, three significant digits: `1.5 GiB`."""
    value = float(num)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


_LIMIT_UNITS = (
    ("PiB", 1024**5),
    ("PB", 1000**5),
    ("TiB", 1024**4),
    ("TB", 1000**4),
    ("GiB", 1024**3),
    ("GB", 1000**3),
    ("MiB", 1024**2),
    ("MB", 1000**2),
    ("KiB", 1024),
    ("KB", 1000),
)


def format_limit(num: int) -> str:
    """A bound a person sets (a quota, the tier's size, `--max-size`) in the unit system it
    was given in, which `parse_size` accepts back: `10G` (the default tier bound) shows as
    `10 GB`, not `9.3 GiB`, and `1.5TiB` as `1.5 TiB`. Others: `format_size`."""
    for unit, size in _LIMIT_UNITS:  # largest first; binary before decimal at each step
        if num >= size and num * 100 % size == 0:  # exact to two decimals in this unit
            return f"{num / size:g} {unit}"
    return format_size(num)


def plural(count: int, one: str, many: str) -> str:
    """`1 entry`, `0 entries`, `2 entries`: every count an operator reads agrees with its
    noun (irregular plurals are why both forms are given)."""
    return f"{count} {one if count == 1 else many}"


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_duration(text: str) -> float:
    """Parse `30d`, `12h`, `90m`, `1w`, `45s` into seconds (a unit is required except for 0)."""
    match = _DURATION_RE.match(text)
    unit = match.group(2).lower() if match else None
    if match is not None and unit == "" and float(match.group(1)) == 0:
        unit = "s"
    if match is None or unit not in _DURATION_UNITS:
        raise ConfigError(
            f"invalid duration {text!r}: use a non-negative number and a unit "
            "s, m, h, d or w, e.g. 30d, 12h or 90m"
        )
    assert unit is not None
    return float(match.group(1)) * _DURATION_UNITS[unit]
