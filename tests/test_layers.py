"""The dependency direction of shared/DESIGN.md, checked on every import in the package.

Parts higher in the list may import lower ones, never the reverse; only the JAX
adapter imports `jax._src`; importing a lower layer loads neither JAX nor the
adapter. Function-level imports count too: a lazy import upward is still upward.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "artifactstore"

# Lowest first. A part is a top-level module or sub-package of artifactstore.
LAYERS: list[set[str]] = [
    {"errors", "redact", "interrupts", "formats"},
    {"config", "metrics"},
    {"blobstores", "index"},
    {"store"},
    {"gc"},
    {"runtime"},
    {"jaxhook"},
    {"named"},  # its JAX half builds and loads through the adapter
    {"bundles"},  # reads named's key convention
    {"warm", "pytest_plugin", "startup", "cli", "__main__", "__init__"},
]
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "__init__"


def _imports(path: Path) -> list[str]:
    """Every artifactstore.* and jax* module `path` imports, at any depth of the code."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    here = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append(module)
            found += [f"{module}.{alias.name}" for alias in node.names]
    return found


def _sources() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        out.append((".".join(rel.parts), path))
    return out


def test_every_part_has_a_layer() -> None:
    parts = {_part(name) for name, _ in _sources()}
    assert parts <= set(RANK), f"add these parts to LAYERS: {sorted(parts - set(RANK))}"


def test_nothing_imports_upward() -> None:
    upward = []
    for name, path in _sources():
        src = _part(name)
        for target in _imports(path):
            if not target.startswith("artifactstore.") or _part(target) not in RANK:
                continue
            dst = _part(target)
            if dst != src and RANK[dst] > RANK[src]:
                upward.append(f"{name} -> {target}")
    assert not upward, "\n".join(upward)


def test_only_the_jax_adapter_imports_jax_internals() -> None:
    offenders = [
        f"{name} -> {target}"
        for name, path in _sources()
        for target in _imports(path)
        if target.startswith("jax._src") and _part(name) != "jaxhook"
    ]
    assert not offenders, "\n".join(offenders)


def test_lower_layers_load_neither_jax_nor_the_adapter() -> None:
    code = (
        "import sys, artifactstore.formats.codec, artifactstore.index.db, artifactstore.store; "
        "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', "
        "'artifactstore.jaxhook', 'artifactstore.runtime'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_named_without_jax_loads_no_jax() -> None:
    """`import artifactstore`, `artstore ls --named` and bundles use named's keys,
    signature, container and spec: they must not pay for JAX (only `named.api`,
    `context`, `build`, `call` and `portable` use it)."""
    code = (
        "import sys, artifactstore.named.keys, artifactstore.named.signature, "
        "artifactstore.named.container, artifactstore.named.spec; "
        "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', "
        "'jaxlib', 'artifactstore.jaxhook', 'artifactstore.runtime'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
