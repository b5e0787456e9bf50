#!/usr/bin/env python3
"""The package's repeated runs, counted: `duplicates` (a developer tool, not a
dependency) over artifactstore/, its pairs of places sharing 6+ lines but those it
marks boilerplate, held at most at MAX_PAIRS.

Function length and parameter counts are tests/test_layers.py's (they need nothing but
the source); this one needs the tool, so it runs where the tool is: without it, it says
so and exits 0 (CI images without it check nothing here). Exit 1 over the bound, with
the pairs listed. Usage: .ci/shape.py [--max N]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

# Non-boilerplate pairs in artifactstore/ when counted (issue 48: 18; the goal: 8). What
# is left is alike in shape only, declarations rather than logic: dataclass fields (gc's
# report, index totals, metrics), ORM columns, click options spelt alike, keyword
# constructions (bundle and portable records), the codec's and the manifest's validators.
MAX_PAIRS = 8
PACKAGE = Path(__file__).resolve().parents[1] / "artifactstore"


def pairs(package: Path = PACKAGE) -> list[str] | None:
    """The non-boilerplate rows `duplicates` lists for `package`; None without the tool."""
    tool = shutil.which("duplicates")
    if tool is None:
        return None
    out = subprocess.run(
        [tool, "--most", "200", "--seconds", "120"],
        cwd=package,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    if "incomplete:" in out:
        raise SystemExit(f".ci/shape.py: duplicates did not finish: {out.strip()[-300:]}")
    return [
        line
        for line in out.splitlines()
        if line.startswith("D") and line[1:2].isdigit() and "boilerplate" not in line
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=MAX_PAIRS, help="most pairs allowed")
    bound = parser.parse_args().max
    found = pairs()
    if found is None:
        print(".ci/shape.py: no `duplicates` tool on this machine: repeated runs not counted")
        return 0
    print(f"repeated runs in artifactstore/: {len(found)} pairs (at most {bound})")
    if len(found) > bound:
        print("\n".join(found))
        print("make one piece of code serve both places (duplicates --change lists yours)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
