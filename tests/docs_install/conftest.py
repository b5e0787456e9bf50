"""The documented extras installed as a user installs them: fresh venvs, unpinned, from the
package index (GBs of PyTorch, minutes). Run only when selected (`-m docs_install`), never
by the README's test command or CI's other phases."""

from __future__ import annotations

import re

import pytest

SELECTED = re.compile(r"(?<!not )\bdocs_install\b")  # `-m docs_install`, not `not docs_install`


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave these out unless `-m` names them."""
    if SELECTED.search(config.getoption("markexpr") or ""):
        return
    out = [item for item in items if item.get_closest_marker("docs_install")]
    if out:
        config.hook.pytest_deselected(items=out)
        items[:] = [item for item in items if item not in out]
