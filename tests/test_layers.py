"""The dependency direction of docs/architecture.md, checked on every import in the package.

Parts higher in the list may import lower ones, never the reverse; only the JAX
adapter imports `jax._src`; importing a lower layer loads neither JAX nor the
adapter. Function-level imports count too: a lazy import upward is still upward.
`formats/` is pure (no I/O, no JAX) and holds the record formats; SQL and the
database's errors are `index/`'s alone; and the house stays small: no more entries at
the top of the package than today (at most 12 of them modules), no module over 450 lines,
no function over 80 lines, few functions with 7+ parameters.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "artifactstore"

# Lowest first. A part is a top-level module or sub-package of artifactstore.
# `config` stays above `formats`: formats say what bytes look like and read no
# settings; config (settings, this host's facts, key files) builds on them.
LAYERS: list[set[str]] = [
    {"errors", "redact", "interrupts", "formats"},
    {"config", "metrics"},
    {"blobstores", "index"},
    {"process"},  # what serves the whole process: executor, lanes, breakers, notices, counters
    {"store"},
    {"gc"},
    {"runtime"},
    {"jaxhook", "torch_xla"},  # the frameworks' adapters, side by side
    {"named"},  # its JAX half builds and loads through the adapter
    {"native"},  # IREE modules of named functions: built from named's portable form
    {"bundles"},  # reads named's key convention
    {"warm", "pytest_plugin", "startup", "cli", "examples", "__main__", "__init__"},
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


# What formats/ may not import (top-level names): files, processes, sockets, the host,
# the clients of the stores, JAX. What bytes look like never depends on where they are.
IO_MODULES = frozenset(
    """
    os pathlib io shutil tempfile glob fcntl mmap select selectors socket ssl signal
    subprocess multiprocessing platform sys urllib http ftplib sqlite3 logging
    boto3 botocore s3transfer sqlalchemy psycopg psycopg2 alembic platformdirs jax jaxlib
    ctypes pwd grp getpass resource asyncio concurrent requests urllib3 tarfile zipfile
    gzip bz2 lzma shelve dbm pickle marshal importlib torch torch_xla flax
    """.split()
)
# Builtins that read or write outside the process's memory.
IO_BUILTINS = frozenset({"open", "print", "input", "breakpoint", "__import__"})
MAX_LINES = 450
MAX_TOP_LEVEL_MODULES = 12
# Packages and modules at the top of artifactstore/ (21 when counted first, issue 39; 22
# with torch_xla/, the second framework's adapter beside jaxhook/, issue 40; 23 with
# process/, what store/ held that serves the whole process, issue 48; 24 with native/, the
# IREE modules of named functions that DESIGN.md's map names as a part, issue 47): a new
# part goes into a folder that exists, or replaces one; never one more beside them.
MAX_TOP_LEVEL_ENTRIES = 24


def _io_uses(source: str) -> list[str]:
    """Each import of an I/O module and each call of an I/O builtin in `source`, at any
    depth of the code (a lazy import counts), with its line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in IO_BUILTINS:
                found.append(f"{node.func.id}() at line {node.lineno}")
        found += [
            f"import {name} at line {node.lineno}"
            for name in names
            if name.split(".")[0] in IO_MODULES
        ]
    return found


def test_formats_do_no_io() -> None:
    """formats/ turns bytes into values and back: reading /proc, env, key files or a
    store is config/ (host.py, keyfiles.py) or the backends, which pass bytes in."""
    offenders = [
        f"{name}: {use}"
        for name, path in _sources()
        if _part(name) == "formats"
        for use in _io_uses(path.read_text())
    ]
    assert not offenders, "\n".join(offenders)


def test_formats_import_only_the_bottom() -> None:
    """formats/ imports nothing of the package but errors and itself: never config, nor
    what stores or decides (blobstores, index, store, runtime, ...), even for a type."""
    allowed = {"errors", "formats"}
    offenders = [
        f"{name} -> {target}"
        for name, path in _sources()
        if _part(name) == "formats"
        for target in _imports(path)
        if target.startswith("artifactstore.") and _part(target) not in allowed
    ]
    assert not offenders, "\n".join(offenders)


def test_the_io_rule_catches_io() -> None:
    """The rule above finds what it is meant to find, including lazy imports."""
    code = "import os\ndef f():\n    from pathlib import Path\n    return open(Path('x'))\n"
    uses = sorted(_io_uses(code), key=lambda use: int(use.rsplit(" ", 1)[1]))
    assert uses == ["import os at line 1", "import pathlib at line 3", "open() at line 4"]


def test_no_module_over_the_line_limit() -> None:
    lines = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for _, path in _sources()
    }
    over = sorted(f"{rel}: {n} lines" for rel, n in lines.items() if n > MAX_LINES)
    assert over == [], f"over {MAX_LINES} lines: split them by what they do"


def _top_level_entries() -> list[str]:
    """The parts a first listing of artifactstore/ shows: modules and folders (packages,
    and `startup/`, which holds no __init__), not data files or caches."""
    return sorted(
        path.name
        for path in PACKAGE.iterdir()
        if (path.suffix == ".py" and path.is_file())
        or (path.is_dir() and not path.name.startswith((".", "__")) and any(path.glob("*.py")))
    )


def test_few_modules_at_the_top() -> None:
    """One folder per part: the first listing of artifactstore/ shows the parts."""
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at the top: {top}"


def test_few_entries_at_the_top() -> None:
    """Packages count too: a feature goes into its part's folder, not a new one beside."""
    top = _top_level_entries()
    assert "formats" in top and "startup" in top and "errors.py" in top  # what is counted
    assert len(top) <= MAX_TOP_LEVEL_ENTRIES, (
        f"{len(top)} entries at the top of artifactstore/ (at most {MAX_TOP_LEVEL_ENTRIES}): "
        f"{top}; put the new one into the part it belongs to"
    )


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(name: str, path: Path, modules: set[str], *, typing: bool = False) -> set[str]:
    """The artifactstore modules `name` imports when it runs: at module level, in
    functions, and by importlib (a package's lazy names: a string naming a module);
    not under `if TYPE_CHECKING:`, which never runs. `from pkg import mod` imports the
    module `mod`; `from pkg import name`, pkg's `__init__`. `typing`: type-only
    imports too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not typing:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{module}" if module else base
            for alias in node.names:
                found.add(
                    f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                )
        elif isinstance(node, ast.Constant) and str(node.value).startswith("artifactstore."):
            found.add(node.value)  # a module named by a string: imported lazily (importlib)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {target for target in found if target in modules and target != name}


def _import_graph(*, typing: bool = False) -> dict[str, set[str]]:
    sources = [(name.removesuffix(".__init__"), path) for name, path in _sources()]
    modules = {name for name, _ in sources}
    return {name: _runtime_imports(name, path, modules, typing=typing) for name, path in sources}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles() -> None:
    """No two modules of the package import each other, directly or around a circle
    (function-level imports and a package's lazy names count: they run too; so do
    type-only imports, under `if TYPE_CHECKING:`: two modules that each need the other
    to be understood are one module in two files). A level that calls back the part
    holding it names what it uses there (a Protocol, or the values themselves)."""
    graph = _import_graph(typing=True)
    assert "artifactstore.store.facade" in graph["artifactstore.store"]  # lazy names seen
    circles = _cycles(graph)
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_circle_rule_counts_type_only_imports(tmp_path: Path) -> None:
    """A circle closed only by a `TYPE_CHECKING` import is found (and is not one at run time)."""
    (tmp_path / "a.py").write_text("from artifactstore.b import B\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from artifactstore.a import A\n"
    )
    modules = {"artifactstore.a", "artifactstore.b"}

    def graph(typing: bool) -> dict[str, set[str]]:
        return {
            name: _runtime_imports(name, tmp_path / f"{name[-1]}.py", modules, typing=typing)
            for name in modules
        }

    assert _cycles(graph(typing=True)) == [["artifactstore.a", "artifactstore.b"]]
    assert _cycles(graph(typing=False)) == []


STORE_PARTS = ("read", "write", "account", "flight", "lease", "uploads", "backends")


def test_store_parts_import_downward_never_the_facade() -> None:
    """The Store's parts take what they need as arguments: none of them imports the
    facade, not even for a type, nor the package's lazy names (which are the facade's)."""
    graph = _import_graph(typing=True)
    facade = {"artifactstore.store", "artifactstore.store.facade"}
    offenders = [
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.rpartition(".")[0] == "artifactstore.store" and name not in facade
        for target in targets & facade
    ]
    missing = [p for p in STORE_PARTS if not (PACKAGE / "store" / f"{p}.py").exists()]
    assert not missing, f"store parts missing: {missing}"
    assert not offenders, "\n".join(offenders)


def test_the_lazy_store_package_imports_nothing_of_its_own() -> None:
    """`artifactstore.store` loads its names on first use (importlib): a warm process
    that only needs `store.tier` imports neither SQLAlchemy nor boto3 through it."""
    tree = ast.parse((PACKAGE / "store" / "__init__.py").read_text())
    eager = [
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom) and "artifactstore" in ast.unparse(node)
    ]
    assert not eager, eager


# SQL is index/'s: other parts call index/ functions, and catch its errors by the names
# index.errors gives them. What they may import from SQLAlchemy is the Engine type
# alone: the handle a Store holds (index.db opens it) and passes to those functions.
SQL_MODULES = frozenset({"sqlalchemy", "alembic", "sqlite3", "psycopg", "psycopg2"})
SQL_HANDLES = frozenset({"Engine"})
SQL_CALLS = frozenset({"execute", "exec_driver_sql", "executescript", "executemany"})
SQL_PARTS = frozenset({"index"})  # and migrations/, outside the package


def _sql_uses(source: str) -> list[str]:
    """Each import of a database module (but the Engine type) and each statement run,
    at any depth of the code, with its line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                f"import {alias.name} at line {node.lineno}"
                for alias in node.names
                if alias.name.split(".")[0] in SQL_MODULES
            ]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] in SQL_MODULES:
                found += [
                    f"from {node.module} import {alias.name} at line {node.lineno}"
                    for alias in node.names
                    if alias.name not in SQL_HANDLES
                ]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in SQL_CALLS:
                found.append(f".{node.func.attr}() at line {node.lineno}")
    return found


def test_sql_only_in_the_index() -> None:
    """Queries (text(), select(), exec_driver_sql) and the database's errors live in
    index/; a store, gc or CLI module that needs one calls an index/ function."""
    offenders = [
        f"{name}: {use}"
        for name, path in _sources()
        if _part(name) not in SQL_PARTS
        for use in _sql_uses(path.read_text())
    ]
    assert not offenders, "\n".join(offenders)


def test_the_sql_rule_catches_sql() -> None:
    """The rule above finds what it is meant to find, and lets the Engine type through."""
    code = (
        "from sqlalchemy import Engine, select\n"
        "def f(engine: Engine):\n"
        "    from sqlalchemy.exc import OperationalError\n"
        "    with engine.connect() as conn:\n"
        "        return conn.exec_driver_sql('SELECT 1')\n"
        "import sqlalchemy\n"
    )
    uses = sorted(_sql_uses(code), key=lambda use: int(use.rsplit(" ", 1)[1]))
    assert uses == [
        "from sqlalchemy import select at line 1",
        "from sqlalchemy.exc import OperationalError at line 3",
        ".exec_driver_sql() at line 5",
        "import sqlalchemy at line 6",
    ]


# Kinds of untrusted bytes whose decoder is not (yet) in formats/: the tier's own files,
# read with the tier (store/tier.py).
DECODERS_OUTSIDE_FORMATS = frozenset({"tier key file", "tier access journal"})


def test_record_decoders_live_in_formats() -> None:
    """What a record read from a bucket looks like is formats/' (pure: bytes to values),
    so each kind's decoder is there; the few others are listed, and none is added."""
    from artifactstore.blobstores.base import UNTRUSTED_KINDS

    outside = {
        kind.name: kind.decoder
        for kind in UNTRUSTED_KINDS
        if not kind.decoder.startswith("artifactstore.formats.")
    }
    assert set(outside) <= DECODERS_OUTSIDE_FORMATS, (
        f"decoders outside formats/: {outside}; move the format into formats/"
    )


# The lookup chain's own modules: the chain, its tier and store levels, and the Store
# whose `get` is its read path's.
CHAIN = {"artifactstore.store.chain", "artifactstore.runtime.sources", "artifactstore.store.facade"}
FETCHES = {"get", "peek", "look"}  # a tier's or a store's verified fetch of an executable
FETCHERS = ("tier", "store", "reads")  # what such a receiver is called (`session.tier`, `_store`)


def _fetches(source: str) -> list[str]:
    """Calls like `tier.get(...)`, `self._store.peek(...)`: an executable fetched from a
    tier or a store directly (`tier.quick.get`, a dict's `get`, are not)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver = node.func.value
        name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
        if node.func.attr in FETCHES and name.lstrip("_").endswith(FETCHERS):
            found.append(f"{ast.unparse(node.func)}() line {node.lineno}")
    return found


def test_only_the_chain_fetches_executables() -> None:
    """One lookup chain (store.chain): the compile hook, named executables and the load
    ahead ask it, never a tier's or a store's `get` themselves, so each hit is counted
    once, where it happens."""
    offenders = [
        f"{name}: {call}"
        for name, path in _sources()
        if name not in CHAIN
        for call in _fetches(path.read_text())
    ]
    assert not offenders, "\n".join(offenders)


def test_the_fetch_rule_catches_a_fetch() -> None:
    code = "def f(session, key):\n    return session.tier.get(key, 'f') or store.peek(key, 'f')\n"
    assert len(_fetches(code)) == 2
    assert _fetches("def f(tier, d):\n    return tier.quick.get('k') or d.get('k')\n") == []


# One counting object per process (process.counters): each part counts its own events
# with `Counters.add`, none adds to another object's attributes (`session.loads += 1`),
# so process_stats() is one snapshot, not a merge. A report of one operation (gc, pull,
# bundles, sign, warm), filled by the function that returns it, is its own.
REPORTS = frozenset({"report", "rep", "result"})


def _foreign_increments(source: str) -> list[str]:
    """`x.name += n` and `x.name[k] += n` in `source` where x is not `self` (or a report)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.AugAssign):
            continue
        target = node.target.value if isinstance(node.target, ast.Subscript) else node.target
        if not isinstance(target, ast.Attribute):
            continue
        receiver = target.value
        name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
        if ast.unparse(receiver) != "self" and name not in REPORTS:
            found.append(f"{ast.unparse(node.target)} line {node.lineno}")
    return found


def test_nothing_counts_on_another_object() -> None:
    """Counts go through the process's Counters (its `add`), never into another part's
    attributes: a session's, a tier's, a store's."""
    offenders = [
        f"{name}: {found}"
        for name, path in _sources()
        for found in _foreign_increments(path.read_text())
    ]
    assert not offenders, "\n".join(offenders) + "\ncount with counters.add(name)"


def test_the_counting_rule_catches_a_foreign_count() -> None:
    code = (
        "def f(self, session):\n"
        "    session.loads += 1\n"
        "    self.session.prefetch['prefetch_used'] += 1\n"
        "    self.hits += 1\n"
        "    report.fetched += 1\n"
    )
    assert _foreign_increments(code) == [
        "session.loads line 2",
        "self.session.prefetch['prefetch_used'] line 3",
    ]


# One put (formats/put.py): what one put carries travels as one `Put`, never as its fields.
# A compile too quick to store is no put: its key, fingerprint digest and compile time go
# to the store (and on to a quick-key record) through these functions.
QUICK_KEY_PATH = frozenset({"compiled_below_threshold", "submit_quick", "publish_quick"})
MAX_PUT_FIELDS = 2  # `get(key, fingerprint_digest)`, `verify(entry, data, ...)`: fine


def _put_field_signatures(source: str, fields: set[str]) -> list[str]:
    """Functions in `source` that take more than MAX_PUT_FIELDS of `fields` as parameters."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            taken = {arg.arg for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]} & fields
            if len(taken) > MAX_PUT_FIELDS and node.name not in QUICK_KEY_PATH:
                found.append(f"{node.name}({', '.join(sorted(taken))}) line {node.lineno}")
    return found


def test_one_put_is_passed_whole() -> None:
    """No function retypes a put's fields as its parameters: the compile hook, named
    builds and imports build one `Put`, and the session, Store, uploads, write path and
    index take it whole, so a new fact about a put is added in one place."""
    from artifactstore.formats.put import Put

    fields = set(Put.__dataclass_fields__)
    offenders = [
        f"{name}: {signature}"
        for name, path in _sources()
        for signature in _put_field_signatures(path.read_text(), fields)
    ]
    assert not offenders, "\n".join(offenders) + "\ntake a formats.put.Put instead"


def test_the_put_rule_catches_a_retyped_put() -> None:
    fields = {"key", "payload", "fingerprint", "module_name", "compile_secs"}
    code = "def put(self, key, payload, *, fingerprint, module_name): ...\n"
    assert _put_field_signatures(code, fields) == [
        "put(fingerprint, key, module_name, payload) line 1"
    ]
    assert _put_field_signatures("def put(self, put, *, then=None): ...\n", fields) == []


# One background executor (process/background.py): every thread the package starts is one
# of its, so work off the program's thread is bounded, reused and drained at exit in one
# place. Ordered queues of work are its lanes (process/lanes.py), not queues of their own.
EXECUTOR = "artifactstore.process.background"
THREADS_OF_THEIR_OWN = {
    # One thread per --jobs slot (up to 256, beyond the executor's bound) drives one
    # worker process for the whole run; its queues carry item indices and results between
    # those drivers and the command: orchestration of processes, no background work.
    "artifactstore.warm.specs": "drives worker processes",
}
THREAD_MAKERS = {
    "threading": {"Thread", "Timer"},
    "queue": {"Queue", "SimpleQueue", "LifoQueue", "PriorityQueue"},
    "concurrent.futures": {"ThreadPoolExecutor"},
    "_thread": {"start_new_thread"},
}


def _threads_made(source: str) -> list[str]:
    """Calls in `source` that make a thread, a thread pool or a job queue."""
    tree = ast.parse(source)
    names = {}  # a name bound by `from MODULE import NAME` -> MODULE.NAME
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in THREAD_MAKERS:
            for alias in node.names:
                if alias.name in THREAD_MAKERS[node.module]:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        made = ast.unparse(node.func)
        module, _, name = made.rpartition(".")
        if name in THREAD_MAKERS.get(module, ()) or made in names:
            found.append(f"{names.get(made, made)}() line {node.lineno}")
    return found


def test_background_work_runs_on_the_one_executor() -> None:
    """No module starts threads, thread pools or job queues of its own: uploads, lease
    heartbeats, bounded store calls, loading ahead, named set-ups, timers, pulls all run
    on the process's one executor (process.background), the queues on its lanes."""
    offenders = [
        f"{name}: {made}"
        for name, path in _sources()
        if name != EXECUTOR and name not in THREADS_OF_THEIR_OWN
        for made in _threads_made(path.read_text())
    ]
    assert not offenders, "\n".join(offenders) + "\nuse process.background / process.lanes"
    for name in THREADS_OF_THEIR_OWN:  # an exception that is no longer needed goes
        path = PACKAGE.parent / (name.replace(".", "/") + ".py")
        assert _threads_made(path.read_text()), f"{name} makes no threads: drop its exception"


def test_the_thread_rule_catches_a_thread() -> None:
    code = (
        "import threading, queue\nfrom concurrent.futures import ThreadPoolExecutor as P\n"
        "threading.Thread(target=f).start()\nq = queue.SimpleQueue()\nP(4)\n"
        "threading.Timer(1, f)\n"
    )
    assert len(_threads_made(code)) == 4
    assert _threads_made("import threading\nthreading.Lock()\nthreading.Event()\n") == []


# One breaker per backend (process/breaker.py): every part asks it before calling a backend;
# nobody keeps a cool-down of their own (a time until which a backend is not asked).
BREAKER = "artifactstore.process.breaker"
BREAKER_SETTINGS = {"breaker_cooldown_secs", "breaker_failures"}


def _cool_downs(source: str) -> list[str]:
    """Reads of the breaker settings, and assignments of `X_until = monotonic() + ...`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in BREAKER_SETTINGS:
            found.append(f"{ast.unparse(node)} line {node.lineno}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            timed = "monotonic()" in ast.unparse(node.value)
            for target in targets:
                if timed and ast.unparse(target).endswith("_until"):
                    found.append(f"{ast.unparse(target)} line {node.lineno}")
    return found


def test_no_cool_down_but_the_breakers() -> None:
    """Lookups, compile leases and uploads ask the backends' breakers (process.breaker)
    for when to try a failed backend again; none keeps a cool-down of its own."""
    offenders = [
        f"{name}: {found}"
        for name, path in _sources()
        if name != BREAKER and not name.startswith("artifactstore.config.")
        for found in _cool_downs(path.read_text())
    ]
    assert not offenders, "\n".join(offenders) + "\nask process.breaker instead"


def test_the_cool_down_rule_catches_a_cool_down() -> None:
    code = (
        "def f(self, settings):\n"
        "    self._paused_until = time.monotonic() + settings.breaker_cooldown_secs\n"
    )
    assert len(_cool_downs(code)) == 2
    assert _cool_downs("deadline = time.monotonic() + timeout\n") == []


# Code outside store/ gets the store's narrow parts (store.parts.StoreParts, or the one
# part it needs: an index function takes the engine), not the Store to reach through
# (issue 39, item 6). The Store's face has no index, blobs or engine any more: commands
# take its parts (`store.parts`, store/parts.py) and hand those on; none is left.
MAX_STORE_REACH_THROUGHS = 0
STORE_PARTS_ATTRS = frozenset({"index", "blobs", "engine"})


def _store_reach_throughs(source: str) -> list[str]:
    """`store.index`, `self._store.blobs`, `run.store.engine`: a part found through a Store."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Attribute) and node.attr in STORE_PARTS_ATTRS):
            continue
        receiver = node.value
        name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
        if name.lstrip("_") == "store":
            found.append(f"{ast.unparse(node)} line {node.lineno}")
    return found


def test_store_reach_throughs_only_go_down() -> None:
    """Pass the parts (StoreParts, or the blobs, index or engine themselves) instead."""
    found = [
        f"{name}: {hit}"
        for name, path in _sources()
        if not name.startswith("artifactstore.store.")
        for hit in _store_reach_throughs(path.read_text())
    ]
    assert len(found) <= MAX_STORE_REACH_THROUGHS, (
        f"{len(found)} reach-throughs into a Store outside store/ (at most "
        f"{MAX_STORE_REACH_THROUGHS}): pass the parts instead\n" + "\n".join(found)
    )


def test_the_reach_through_rule_catches_a_reach_through() -> None:
    code = (
        "def f(run, store):\n    run.store.engine\n    self._store.blobs.get(d)\n    store.index\n"
    )
    assert len(_store_reach_throughs(code)) == 3
    assert _store_reach_throughs("def f(parts, ix):\n    parts.index\n    ix.engine\n") == []


# Shape (issue 48, item 6): a function says one thing. A long one becomes named steps; the
# parameters that travel together become one value (an options object), not seven names.
MAX_FUNCTION_LINES = 80
MANY_PARAMETERS = 7  # parameters but self/cls (a *args or **kwargs counts as one)
# Longer for now, each in a module another piece of issue 48 is rewriting: it goes there.
LONG_FOR_NOW: dict[str, str] = {}
# The few that take 7+ and should: a signature someone else chose.
MANY_PARAMETERS_ALLOWED = {
    "artifactstore.jaxhook.compile.compile_or_get_cached": "JAX's own signature, replaced",
    "artifactstore.named.api.compiled": "the public call: a user's keywords",
}
# Functions with 7+ parameters at most, the allowed ones included (the goal of issue 48):
# Store.open, Parts.__init__, `bundles.pull.pull` and the two allowed above.
MAX_MANY_PARAMETER_FUNCTIONS = 5


def _functions(source: str, module: str) -> list[tuple[str, int, ast.FunctionDef]]:
    """Each function in `source` (methods and nested ones too), with its dotted name
    (module.Class.name, nested functions under their outer one) and line count."""
    found: list[tuple[str, int, ast.FunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}.{child.name}"
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                found.append((name, lines, child))  # type: ignore[arg-type]
                visit(child, name)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}.{child.name}")
            else:
                visit(child, prefix)

    visit(ast.parse(source), module)
    return found


def _parameters(function: ast.FunctionDef) -> int:
    a = function.args
    named = [arg.arg for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
    return len([n for n in named if n not in ("self", "cls")]) + bool(a.vararg) + bool(a.kwarg)


def _is_command(function: ast.FunctionDef) -> bool:
    """A click command: its parameters are its options, declared a decorator each above
    it (click passes them by name), so they are counted there, not here."""
    return any(
        ast.unparse(d).startswith(("click.", "group.")) or "pass_obj" in ast.unparse(d)
        for d in function.decorator_list
    )


def _shape(source: str, module: str) -> tuple[list[str], list[str]]:
    """The functions in `source` over MAX_FUNCTION_LINES, and those (but commands) taking
    MANY_PARAMETERS or more."""
    functions = _functions(source, module)
    long = [f"{name}: {n} lines" for name, n, _ in functions if n > MAX_FUNCTION_LINES]
    many = [
        f"{name}: {_parameters(f)} parameters"
        for name, _, f in functions
        if _parameters(f) >= MANY_PARAMETERS and not _is_command(f)
    ]
    return long, many


def _package_shape() -> tuple[list[str], list[str]]:
    long: list[str] = []
    many: list[str] = []
    for name, path in _sources():
        found_long, found_many = _shape(path.read_text(), name.removesuffix(".__init__"))
        long += found_long
        many += found_many
    return long, many


def test_no_function_over_80_lines() -> None:
    """A long function becomes named steps, each saying what it does."""
    long, _ = _package_shape()
    over = [found for found in long if found.split(":")[0] not in LONG_FOR_NOW]
    assert not over, "\n".join(over) + "\nsplit them into named steps"
    still = {found.split(":")[0] for found in long}
    assert still >= set(LONG_FOR_NOW), f"no longer long: {set(LONG_FOR_NOW) - still}: drop them"


def test_few_functions_take_seven_parameters() -> None:
    """Parameters that travel together are one value: at most a few functions take 7+."""
    _, many = _package_shape()
    names = {found.split(":")[0] for found in many}
    assert names >= set(MANY_PARAMETERS_ALLOWED), (
        f"take fewer now: {set(MANY_PARAMETERS_ALLOWED) - names}: drop them from the list"
    )
    assert len(many) <= MAX_MANY_PARAMETER_FUNCTIONS, (
        f"{len(many)} functions take {MANY_PARAMETERS}+ parameters (at most "
        f"{MAX_MANY_PARAMETER_FUNCTIONS}): pass the ones that travel together as one value\n"
        + "\n".join(sorted(many))
    )


def test_the_shape_rules_catch_a_long_function_and_many_parameters() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    code = (
        f"class A:\n  def long(self):\n{body}\n"
        "def many(a, b, c, d, e, f, *g, **h):\n    def inner(self, a, b): pass\n"
        "def six(self, a, b, c, d, e, f): pass\n"
        "@click.command('x')\n@click.pass_obj\ndef cmd(a, b, c, d, e, f, g, h): pass\n"
    )
    long, many = _shape(code, "m")
    assert long == [f"m.A.long: {MAX_FUNCTION_LINES + 1} lines"]
    assert many == ["m.many: 8 parameters"]


# One verifier (store.verify): the only module that opens an object's envelope
# (`codec.decode`), so every level and every entry kind is checked by one function, and
# the levels decide only what its refusal costs.
VERIFIER = "artifactstore.store.verify"
CODEC = "artifactstore.formats.codec"
ENVELOPE_DECODERS = frozenset({"decode", "decode_entry"})


def _envelope_decodes(source: str) -> list[str]:
    """`codec.decode(...)` (under any name the codec module was imported as) and
    `from artifactstore.formats.codec import decode`: an entry's envelope opened."""
    tree = ast.parse(source)
    names = {"codec"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name for a in node.names if a.name == CODEC}
        elif isinstance(node, ast.ImportFrom) and node.module == "artifactstore.formats":
            names |= {a.asname or a.name for a in node.names if a.name == "codec"}
        elif isinstance(node, ast.ImportFrom) and node.module == CODEC:
            found += [
                f"import of {a.name} line {node.lineno}"
                for a in node.names
                if a.name in ENVELOPE_DECODERS
            ]
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver = ast.unparse(node.func.value)
        if node.func.attr in ENVELOPE_DECODERS and receiver in names | {CODEC}:
            found.append(f"{ast.unparse(node.func)}() line {node.lineno}")
    return found


def test_one_verifier_opens_envelopes() -> None:
    """No level checks an object's bytes itself: each asks store.verify."""
    offenders = [
        f"{name}: {hit}"
        for name, path in _sources()
        if name not in (VERIFIER, CODEC)
        for hit in _envelope_decodes(path.read_text())
    ]
    assert not offenders, "\n".join(offenders)
    assert _envelope_decodes((PACKAGE / "store" / "verify.py").read_text()), "rule out of date"


def test_the_verifier_rule_catches_a_decode() -> None:
    code = (
        "from artifactstore.formats import codec as c\n"
        "from artifactstore.formats.codec import decode, decode_entry\n"
        "import artifactstore.formats.codec\n"
        "def f(d):\n    c.decode(d)\n    artifactstore.formats.codec.decode(d)\n"
    )
    assert len(_envelope_decodes(code)) == 4
    harmless = "from artifactstore.formats import codec\ndef f(d, m):\n    m.decode(d)\n"
    assert _envelope_decodes(harmless + "    d.decode()\n    codec.read_meta(d)\n") == []
