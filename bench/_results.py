"""What every benchmark records about its run, and how it writes its results."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any


def run_info() -> dict[str, Any]:
    """Date, Python, jax/jaxlib and host facts, so results from different machines compare."""
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
        "host": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "machine": platform.machine(),
            "processor": platform.processor(),
        },
    }


def write(out: Path, report: dict[str, Any], table: str) -> None:
    """The report as JSON at `out`, the printed table beside it as .txt."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".txt").write_text(table + "\n")
    print(f"\nwrote {out} and {out.with_suffix('.txt')}")
