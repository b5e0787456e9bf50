"""MkDocs hook: the configuration reference, generated from artifactstore.config at build time.

Every setting is one row of artifactstore.config.table (name, keyword, type, default, what
it means); the other variables are rows of artifactstore.config.variables. The build fails
when the source names an `ARTSTORE_*` variable no row declares, or a row declares one that
nothing names, so the page cannot drift from the code.

The metrics tables come from artifactstore.metrics the same way (names, labels, help), the
table of what a process counts from artifactstore.formats.counters (names, meanings, the
deprecated 0.3 names), and
`<!-- bench: FILE -->` shows bench/results/FILE as committed, so no number on the
performance page is typed by hand.
A page asks for a table with a marker line: `<!-- generated: settings -->`,
`<!-- generated: variables -->`, `<!-- generated: metrics -->`,
`<!-- generated: index-metrics -->` or `<!-- generated: counters -->`.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
_MARKERS = (
    "<!-- generated: settings -->",
    "<!-- generated: variables -->",
    "<!-- generated: metrics -->",
    "<!-- generated: index-metrics -->",
    "<!-- generated: counters -->",
)
_BENCH = re.compile(r"^<!-- bench: ([\w.-]+) -->$", re.MULTILINE)
_ENV_NAME = re.compile(r"\bARTSTORE_[A-Z0-9_]*[A-Z0-9]\b")


def _rows() -> tuple[Any, Any]:
    """The settings and the other variables, as artifactstore.config declares them."""
    config = importlib.import_module("artifactstore.config")
    return config.SETTINGS, [row for row in config.VARIABLES if row.keyword is None]


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def settings_table() -> str:
    """An overview table, then one section per setting, in the table's order."""
    table_module = importlib.import_module("artifactstore.config.table")
    settings, _ = _rows()
    table = ["| variable | `configure()` | type | default |", "|---|---|---|---|"]
    sections = []
    for row in settings:
        default = table_module.default_text(row)
        anchor = row.env.lower()
        table.append(
            f"| [`{row.env}`](#{anchor}) | `{row.keyword}=` | {row.kind} | {_cell(default)} |"
        )
        sections.append(
            f"### `{row.env}` {{ #{anchor} }}\n\n"
            f"`configure({row.keyword}=...)`; {row.kind}; default: {_cell(default)}\n\n"
            f"{_cell(row.doc)}\n"
        )
    return "\n".join(table) + "\n\n## Each setting\n\n" + "\n".join(sections)


def variables_table() -> str:
    """The other ARTSTORE_* variables; every one the source names must be declared (a
    setting or one of these), and each of these must still be named somewhere."""
    settings, others = _rows()
    declared = {row.env for row in (*settings, *others)}
    used: set[str] = set()
    for path in (REPO / "artifactstore").rglob("*.py"):
        used.update(_ENV_NAME.findall(path.read_text(encoding="utf-8")))
    named = set(used)
    for path in [*(REPO / "infra").rglob("*.sql"), *(REPO / "tests").rglob("*.py")]:
        named.update(_ENV_NAME.findall(path.read_text(encoding="utf-8")))
    unknown = sorted(used - declared)
    stale = sorted(row.env for row in others if row.env not in named)
    problems = []
    if unknown:
        problems.append(f"variables the source names but config does not declare: {unknown}")
    if stale:
        problems.append(f"variables config declares that nothing names: {stale}")
    if problems:
        raise PluginError("configuration reference: " + "; ".join(problems))
    rows = ["| variable | meaning |", "|---|---|"]
    rows += [f"| `{row.env}` | {_cell(row.doc)} |" for row in others]
    return "\n".join(rows)


def _labels(labels: tuple[str, ...]) -> str:
    return ", ".join(f"`{label}`" for label in labels)


def metrics_table() -> str:
    """What a process exports: counters and histograms, their labels and help, and the
    kinds of `artstore_errors_total`."""
    metrics = importlib.import_module("artifactstore.metrics")
    docs: dict[str, str] = getattr(metrics, "_DOCS", {})
    rows = ["| metric | labels | meaning |", "|---|---|---|"]
    for name, labels in metrics.COUNTERS.items():
        rows.append(f"| `{name}_total` | {_labels(labels)} | {_cell(docs.get(name, ''))} |")
    for name, labels in metrics.HISTOGRAMS.items():
        rows.append(f"| `{name}` (histogram) | {_labels(labels)} | {_cell(docs.get(name, ''))} |")
    kinds = ", ".join(f"`{kind}`" for kind in dict.fromkeys(metrics.ERROR_KINDS.values()))
    return "\n".join(rows) + f"\n\nKinds of `artstore_errors_total`: {kinds}."


def counters_table() -> str:
    """What `process_stats()` and the summaries carry: each name, what it means, the
    metric it feeds; then 0.3's renamed names, deprecated."""
    names = importlib.import_module("artifactstore.formats.counters")
    metrics = importlib.import_module("artifactstore.metrics")
    rows = ["| name | meaning | metric |", "|---|---|---|"]
    for name, entry in names.NAMES.items():
        metric = ""
        if name in metrics.FEEDS:
            feeds, value = metrics.FEEDS[name]
            label = f'{{{metrics.COUNTERS[feeds][1]}="{value}"}}' if value is not None else ""
            metric = f"`{feeds}_total{label}`"
        rows.append(f"| `{name}` | {_cell(entry.meaning)} | {metric} |")
    old = ["| 0.3 name (deprecated) | now |", "|---|---|"]
    old += [f"| `{alias}` | `{new}` |" for alias, new in names.DEPRECATED.items()]
    return (
        "\n".join(rows)
        + f"\n\nDeprecated: `stats --json` and `process_stats()` also carry these 0.3 names, "
        f"with the same values, until {names.REMOVED_IN}:\n\n" + "\n".join(old)
    )


def index_metrics_table() -> str:
    """What `artstore metrics` prints from the index."""
    metrics = importlib.import_module("artifactstore.metrics")
    rows = ["| metric | meaning |", "|---|---|"]
    rows += [f"| `{name}` | {_cell(text)} |" for name, text in metrics.INDEX_GAUGES.items()]
    for name, labels in metrics.INDEX_COUNTERS.items():
        rows.append(
            f"| `{name}_total` ({_labels(labels)}) | The index's persistent event counters. |"
        )
    return "\n".join(rows)


def bench_result(match: re.Match[str]) -> str:
    """A committed benchmark result: markdown tables as they are, other text verbatim."""
    path = REPO / "bench" / "results" / match.group(1)
    if not path.is_file():
        raise PluginError(f"performance page: no bench/results/{match.group(1)}")
    text = path.read_text(encoding="utf-8").strip()
    if re.search(r"^\|[-| ]+\|$", text, re.MULTILINE):
        return text
    return f"```text\n{text}\n```"


def on_config(config: Any) -> Any:
    """The pages (this hook's tables, mkdocs-click's CLI reference) describe this checkout's
    code, not whatever version is installed elsewhere. (MkDocs restores sys.path after
    loading a hook module, so this is done here.)"""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the marker lines of a page with the generated tables."""
    if _MARKERS[0] in markdown:
        markdown = markdown.replace(_MARKERS[0], settings_table())
    if _MARKERS[1] in markdown:
        markdown = markdown.replace(_MARKERS[1], variables_table())
    if _MARKERS[2] in markdown:
        markdown = markdown.replace(_MARKERS[2], metrics_table())
    if _MARKERS[3] in markdown:
        markdown = markdown.replace(_MARKERS[3], index_metrics_table())
    if _MARKERS[4] in markdown:
        markdown = markdown.replace(_MARKERS[4], counters_table())
    return _BENCH.sub(bench_result, markdown)
