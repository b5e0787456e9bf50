"""What every benchmark records about its run, and how it writes its results."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
# (column header, metric, baseline config): the metric's median over the baseline's.
RatioCol = tuple[str, str, str]


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


def default_out(name: str) -> Path:
    """`bench/results/NAME-jaxVERSION.json`: results of each JAX release are kept side by side."""
    return RESULTS / f"{name}-jax{version('jax')}.json"


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def table(
    res: dict[str, dict[str, Any]],
    columns: list[tuple[str, str]],
    ratio_cols: list[RatioCol],
    targets: list[tuple[str, float]] | list[tuple[str, float] | tuple[str, float, str]],
    baseline: str,
) -> tuple[list[str], list[dict[str, Any]]]:
    """Rows of median (min-max) per (header, metric) column and ratio columns, then one
    line per target (`config` wall <= ratio x `baseline` wall; a third item in a target
    is its own baseline). Adds `ratios` to `res`."""

    def med(name: str, key: str) -> float | None:
        return res[name][key]["median"] if name in res else None

    w = max(len(n) for n in res) + 1
    lines = [f"{'config':<{w}}" + "".join(f"{h:>22}" for h, _ in columns)
             + "".join(f"{h:>17}" for h, _, _ in ratio_cols)]  # fmt: skip
    for name, r in res.items():
        r["ratios"] = {h: ratio(med(name, k), med(base, k)) for h, k, base in ratio_cols}
        cells = [f"{r[k]['median']:.3f} ({r[k]['min']:.2f}-{r[k]['max']:.2f})" for _, k in columns]
        shown = [f"{x:.3f}x" if x is not None else "-" for x in r["ratios"].values()]
        lines.append(f"{name:<{w}}" + "".join(f"{c:>22}" for c in cells)
                     + "".join(f"{x:>17}" for x in shown))  # fmt: skip
    verdicts = []
    for t_name, t_max, *own in targets:
        base = own[0] if own else baseline
        got = ratio(med(t_name, "wall_secs"), med(base, "wall_secs"))
        verdict = "n/a" if got is None else ("PASS" if got <= t_max else "MISS")
        # "wall_vs_jax_warm": the name older results use; it is the ratio to `baseline`.
        verdicts.append({"config": t_name, "ratio_max": t_max, "wall_vs_jax_warm": got,
                         "baseline": base, "verdict": verdict})  # fmt: skip
    return lines, verdicts


def grid(header: list[str], rows: list[list[str]]) -> list[str]:
    """Plain rows as lines: the first column left-aligned, the rest right-aligned, each
    as wide as its widest cell (for benches whose rows are not config x median)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in [header, *rows]]  # fmt: skip


def target_lines(verdicts: list[dict[str, Any]], baseline: str) -> list[str]:
    out = []
    for t in verdicts:
        got = t["wall_vs_jax_warm"]
        shown = "n/a" if got is None else f"{got:.3f}x {t['verdict']}"
        base = t.get("baseline", baseline)
        out.append(f"target: {t['config']} wall <= {t['ratio_max']:.2f}x {base} wall: {shown}")
    return out
