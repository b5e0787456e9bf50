"""The Store is a small face for programs; operators' commands use its parts.

A program needs a lookup and its count, a put (at once or queued), the flush and the
close, its compile leases and, for `artstore warm`, a recorder: a dozen names. Every
other need is a part's (`store.parts`: index, blobs, tier, records, reads, writes,
accounts), so that a feature for operators adds nothing here and nothing relays it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from conftest import OpenStore, clean_env

from artifactstore.config.host import compute
from artifactstore.formats.put import Put
from artifactstore.store import Found, Missed

K1 = "a" * 64
PACKAGE = Path(__file__).resolve().parents[1] / "artifactstore"
MAX_FACE = 12
FACE = {
    "open",
    "parts",
    "flight",
    "get",
    "look",
    "count",
    "put",
    "submit",
    "compiled_below_threshold",
    "record",
    "flush",
    "close",
}
FP = compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                 device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


def _public(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def test_the_face_is_at_most_a_dozen_names(tmp_path: Path, open_store: OpenStore) -> None:
    """Counted on an opened Store, so that instance attributes count too."""
    store = open_store(clean_env(ARTSTORE_URL=str(tmp_path / "s")))
    face = _public(store)
    assert len(face) <= MAX_FACE, f"the Store's face grew to {len(face)}: {sorted(face - FACE)}"
    assert face == FACE, "a new name on the face: give it to a part (store.parts) instead"


class Recording:
    """A recorder as warm's (warm.child.Recorder), noting what the hook is told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, Any]] = []

    def counted(self, key: str, outcome: Found | Missed) -> None:
        self.told.append(("counted", type(outcome).__name__))

    def put(self, put: Put, store: Any) -> bool:
        self.told.append(("put", put.key))
        return bool(store(put))

    def submit(self, put: Put, then: Any, store: Any) -> None:
        self.told.append(("submit", put.key))
        published = store(put)
        if then is not None:
            then(published)

    def compiled_below_threshold(self, key: str, fingerprint: str, compile_secs: float) -> None:
        self.told.append(("below", key))


def test_the_recorder_hook_is_told_and_methods_stay_the_stores(
    tmp_path: Path, open_store: OpenStore
) -> None:
    store = open_store(clean_env(ARTSTORE_URL=str(tmp_path / "s")))
    recorder = Recording()
    store.record(recorder)
    ended: list[bool] = []
    store.submit(Put(K1, b"x" * 100, FP, "jit_f", 2.0), then=ended.append)
    assert ended == [True]  # made at once (a warming process waits for its puts)
    assert store.get(K1, FP.digest) is not None
    assert store.get("0" * 64, FP.digest) is None
    store.compiled_below_threshold("1" * 64, FP.digest, 0.01)
    assert recorder.told == [
        ("submit", K1),
        ("put", K1),
        ("counted", "Found"),
        ("counted", "Missed"),
        ("below", "1" * 64),
    ]
    assert set(vars(store)) & FACE == {"parts"}  # no method replaced on the instance
    counts = store.parts.counters.snapshot()
    assert counts["warm_compiles"] == 1 and not counts.get("lookups_missed")


def _assigned_store_names(source: str) -> list[str]:
    """`x.store.put = f`, `store.count = f`: a Store's name replaced from outside."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            for one in target.elts if isinstance(target, ast.Tuple) else [target]:
                if not (isinstance(one, ast.Attribute) and one.attr in FACE):
                    continue
                receiver = one.value
                name = receiver.attr if isinstance(receiver, ast.Attribute) else ""
                name = name or getattr(receiver, "id", "")
                if name.lstrip("_") == "store":
                    found.append(f"{ast.unparse(one)} line {node.lineno}")
    return found


def test_no_code_replaces_a_stores_methods() -> None:
    """Recording goes through `Store.record`; no module overwrites `count` or `put`."""
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}: {hit}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for hit in _assigned_store_names(path.read_text())
    ]
    assert not offenders, "\n".join(offenders)
    assert len(_assigned_store_names("store.count, store.put = a, b\nself.store.get = c\n")) == 3
