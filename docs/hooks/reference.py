"""MkDocs hook: the configuration reference, generated from artifactstore.config at build time.

The code decides which settings exist, their order, their `ARTSTORE_*` names and most
defaults; `settings.yml` beside this file says what each means. The build fails when the
two disagree (a setting added in the code but not described, a description of a setting
that is gone, a `DEFAULT_*` constant no row shows, an `ARTSTORE_*` variable in the source
that is neither a setting nor listed), so the page cannot drift from the code.

The metrics tables come from artifactstore.metrics the same way (names, labels, help), and
`<!-- bench: FILE -->` shows bench/results/FILE as committed, so no number on the
performance page is typed by hand.
A page asks for a table with a marker line: `<!-- generated: settings -->`,
`<!-- generated: variables -->`, `<!-- generated: metrics -->` or
`<!-- generated: index-metrics -->`.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from mkdocs.exceptions import PluginError

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
_MARKERS = (
    "<!-- generated: settings -->",
    "<!-- generated: variables -->",
    "<!-- generated: metrics -->",
    "<!-- generated: index-metrics -->",
)
_BENCH = re.compile(r"^<!-- bench: ([\w.-]+) -->$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"\{(DEFAULT_[A-Z0-9_]+)\}")
_ENV_NAME = re.compile(r"\bARTSTORE_[A-Z0-9_]*[A-Z0-9]\b")


def _option_table() -> dict[str, str]:
    """`configure()` option -> ARTSTORE_ suffix: the table `resolve()` reads, wherever in
    artifactstore.config it lives (a module, or a module of the package)."""
    config = importlib.import_module("artifactstore.config")
    table = getattr(config, "_OPTIONS", None)
    if table is None and hasattr(config, "__path__"):
        for info in pkgutil.iter_modules(config.__path__, "artifactstore.config."):
            table = getattr(importlib.import_module(info.name), "_OPTIONS", None)
            if table is not None:
                break
    if not isinstance(table, dict) or not table:
        raise PluginError("docs/hooks/reference.py: artifactstore.config has no option table")
    return dict(table)


def _render(value: Any) -> str:
    """A default as a user writes it: `10`, `0.1`, `4GiB`, `10G`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float):
        return f"{value:g}"
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2)):
        if value >= size and value % size == 0:
            return f"{value // size}{unit}"
    for unit, size in (("T", 1000**4), ("G", 1000**3), ("M", 1000**2)):
        if value >= size and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


def _load() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((HERE / "settings.yml").read_text())
    return data


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def settings_table() -> str:
    """An overview table, then one section per setting, in the code's order; fails on any
    disagreement between the code and settings.yml."""
    config = importlib.import_module("artifactstore.config")
    prefix = str(config.ENV_PREFIX)
    options = _option_table()
    described: dict[str, dict[str, str]] = _load()["settings"]
    problems = []
    missing = [o for o in options if o not in described]
    stale = [o for o in described if o not in options]
    if missing:
        problems.append(f"settings in the code but not in settings.yml: {', '.join(missing)}")
    if stale:
        problems.append(f"settings in settings.yml but not in the code: {', '.join(stale)}")
    shown: set[str] = set()
    table = ["| variable | `configure()` | default |", "|---|---|---|"]
    sections = []
    for option, suffix in options.items():
        if option not in described:
            continue
        text = described[option]
        default = str(text["default"])
        for name in _PLACEHOLDER.findall(default):
            if not hasattr(config, name):
                problems.append(f"{option}: artifactstore.config has no {name}")
                continue
            shown.add(name)
            default = default.replace(f"{{{name}}}", _render(getattr(config, name)))
        env = f"{prefix}{suffix}"
        anchor = env.lower()
        table.append(f"| [`{env}`](#{anchor}) | `{option}=` | {_cell(default)} |")
        sections.append(
            f"### `{env}` {{ #{anchor} }}\n\n"
            f"`configure({option}=...)`; default: {' '.join(default.split())}\n\n"
            f"{' '.join(str(text['meaning']).split())}\n"
        )
    unshown = sorted(n for n in dir(config) if n.startswith("DEFAULT_") and n not in shown)
    if unshown:
        problems.append(f"defaults no row of settings.yml shows: {', '.join(unshown)}")
    if problems:
        raise PluginError("configuration reference: " + "; ".join(problems))
    return "\n".join(table) + "\n\n## Each setting\n\n" + "\n".join(sections)


def variables_table() -> str:
    """The other ARTSTORE_* variables; every one the source reads must be a setting or here."""
    config = importlib.import_module("artifactstore.config")
    settings_env = {str(config.ENV_PREFIX) + s for s in _option_table().values()}
    listed: dict[str, str] = _load()["variables"]
    used: set[str] = set()
    for path in (REPO / "artifactstore").rglob("*.py"):
        used.update(_ENV_NAME.findall(path.read_text(encoding="utf-8")))
    unknown = sorted(used - settings_env - set(listed))
    stale = sorted(set(listed) - used)
    problems = []
    if unknown:
        problems.append(f"variables the source reads but settings.yml lacks: {', '.join(unknown)}")
    if stale:
        problems.append(f"variables in settings.yml the source never reads: {', '.join(stale)}")
    if problems:
        raise PluginError("configuration reference: " + "; ".join(problems))
    rows = ["| variable | meaning |", "|---|---|"]
    rows += [f"| `{name}` | {_cell(text)} |" for name, text in listed.items()]
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
    return "\n".join(rows) + (
        f"\n\nKinds of `artstore_errors_total`: {kinds}, and the local tier's refusals as "
        "`tier_<reason>`."
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
    return _BENCH.sub(bench_result, markdown)
