"""Line coverage of artifactstore/ by the tests and the programs they start; a floor per part.

`.ci/run` runs the newest end's tests under `coverage run` (pyproject.toml's
[tool.coverage.run]: `patch = subprocess`, parallel data files), so every Python process
of the venv a test starts (CLI commands, JAX programs, fork servers' children, xdist
workers) writes its own data file. This combines them, prints the least covered modules,
the total and each part below, and exits 1 if a part is under its floor.

The floors sit under what was measured: a change that drops a part's coverage below one is
either tested or lowers the floor here, in the open. Raise them as coverage grows. The whole
suite under `coverage run` (CI's newest end, rehearsed on 2 cores): store/ 95.3%, formats/
95.7%, jaxhook/ 93.2%, all of artifactstore/ 91.6%; the floors leave a point or two for what
timing decides (a retry, a takeover) to fall either way.

    python .ci/coverage_floor.py    # combine the .coverage.* files, report, check
"""

from __future__ import annotations

import sys
from pathlib import Path

import coverage
from coverage.exceptions import NoDataError

PACKAGE = Path(__file__).resolve().parents[1] / "artifactstore"
# Per cent of statements run, per folder of artifactstore/ (every .py file in it, imported
# by a test or not).
FLOORS = {"store": 93.0, "formats": 94.0, "jaxhook": 91.0}


def part_coverage(cov: coverage.Coverage, folder: Path) -> tuple[int, int]:
    """(statements, statements run) over every module under `folder`."""
    statements = run = 0
    for path in sorted(folder.rglob("*.py")):
        _, lines, _, missing, _ = cov.analysis2(str(path))
        statements += len(lines)
        run += len(lines) - len(missing)
    return statements, run


def main() -> int:
    cov = coverage.Coverage()
    try:  # each process's .coverage.* file into .coverage (COVERAGE_FILE: elsewhere)
        cov.combine()
    except NoDataError:
        pass  # combined already
    else:
        cov.save()
    cov.load()
    if not cov.get_data().measured_files():
        print(".ci/coverage_floor.py: no coverage data here; run the tests under `coverage run`")
        return 1
    cov.report(sort="-miss", skip_covered=True, show_missing=False, file=_Head(14))
    total = cov.report(file=_Null())
    print(f"line coverage of artifactstore/ (tests and the programs they start): {total:.1f}%")
    under = []
    for name, floor in FLOORS.items():
        statements, run = part_coverage(cov, PACKAGE / name)
        percent = 100.0 * run / statements if statements else 100.0
        verdict = "ok" if percent >= floor else "UNDER THE FLOOR"
        print(f"  artifactstore/{name}/: {percent:.1f}% of {statements} lines "
              f"(floor {floor:.0f}%): {verdict}")  # fmt: skip
        if percent < floor:
            under.append(name)
    if under:
        parts = ", ".join(under)
        print(f".ci/coverage_floor.py: coverage of {parts} fell under its floor: test the "
              "new lines, or lower the floor in .ci/coverage_floor.py saying why")  # fmt: skip
        return 1
    return 0


class _Null:
    def write(self, text: str) -> int:
        return len(text)


class _Head:
    """A stream that passes on the first `lines` lines (the table's head and worst rows)."""

    def __init__(self, lines: int) -> None:
        self.left = lines

    def write(self, text: str) -> int:
        for line in text.splitlines(True):
            if self.left > 0:
                sys.stdout.write(line)
                self.left -= line.endswith("\n")
        return len(text)


if __name__ == "__main__":
    sys.exit(main())
