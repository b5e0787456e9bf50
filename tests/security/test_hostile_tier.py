"""Issue 38 item 3: hostile files in a host's tier, through the tier's own reads.

A tier is this user's alone (safedir), but `artstore pull` fills it from the bucket and
a crash or a full disk can leave anything in a file: whatever its key files, access
journals and quick-keys file hold, a lookup is a miss or the stored payload (never
another entry's), a fold skips what it cannot read, and nothing raises into the program.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from artifactstore.blobstores.local import LocalBlobStore
from artifactstore.store.quick import QuickKeys
from artifactstore.store.tier import LocalTier, Reads
from security import hostile
from security.hostile import FP, KEY, OTHER, PAYLOADS

ENCODED = {key: hostile.signed(key, payload) for key, payload in PAYLOADS.items()}
MANIFESTS = {key: hostile.manifest_of(key, enc) for key, enc in ENCODED.items()}


def _json(key: str) -> dict[str, object]:
    return {
        "v": 1,
        "d": ENCODED[key].digest,
        "f": FP.digest,
        "c": 1.5,
        "k": key,
        "r": ENCODED[key].raw_size,
        "s": len(ENCODED[key].data),
        "m": "jit_f",
        "cb": 0,
        "sg": hostile.SIGNER.name,
    }


def _old(key: str) -> dict[str, object]:
    """A 0.2 key file: {"d", "f", "c"}."""
    return {"d": ENCODED[key].digest, "f": FP.digest, "c": 1.5}


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> LocalTier:
    root = tmp_path_factory.mktemp("tier")
    os.chmod(root, 0o700)
    found = LocalTier(
        LocalBlobStore(root, "default", top=root),
        owns_objects=True,
        reads=Reads(trusted=hostile.TRUSTED, namespace="default"),
    )
    found.prepare()
    return found


def _fill(tier: LocalTier) -> None:
    for key in PAYLOADS:
        tier.remember(key, MANIFESTS[key], ENCODED[key].data)


def _refusals(tier: LocalTier) -> int:
    """What the tier refused so far: its `tier_<reason>` counts in the process's counters."""
    counts = tier.counters.snapshot()
    return sum(n for name, n in counts.items() if name.startswith("tier_") and name != "tier_hits")


def _key_file(tier: LocalTier, key: str) -> Path:
    return tier.keys / key[:2] / key


KEY_FILES = st.one_of(
    hostile.records(_json(KEY), max_bytes=16384, others=[_json(OTHER)]),
    hostile.records(_old(KEY), max_bytes=16384, others=[_old(OTHER)]),
    st.sampled_from([hostile.dump(_json(OTHER)), hostile.dump(_old(OTHER))]),
)


@pytest.mark.hostile_record("tier key file")
@given(KEY_FILES)
@example(hostile.DEEP)
@example(b'{"d":"' + b"0" * 64 + b'","f":"' + FP.digest.encode() + b'","c":1' + b"0" * 400 + b"}")
@example(hostile.dump({"d": "../../../etc/passwd", "f": FP.digest, "c": 1}))
@example(hostile.dump(_old(OTHER)))
def test_a_hostile_key_file_is_a_miss_or_the_stored_payload(tier: LocalTier, data: bytes) -> None:
    _fill(tier)
    _key_file(tier, KEY).write_bytes(data)
    before = _refusals(tier)
    hit = tier.get(KEY, FP.digest, callbacks=0)
    assert hit is None or hit.payload == PAYLOADS[KEY]
    if data == hostile.dump(_old(OTHER)):  # the other entry's object: refused, and counted
        assert hit is None and _refusals(tier) == before + 1
    _fill(tier)
    other = tier.get(OTHER, FP.digest, callbacks=0)
    assert other is not None and other.payload == PAYLOADS[OTHER]


def test_the_genuine_key_file_hits(tier: LocalTier) -> None:
    """The property above is not vacuous: an untouched tier serves KEY."""
    _fill(tier)
    hit = tier.get(KEY, FP.digest, callbacks=0)
    assert hit is not None and hit.payload == PAYLOADS[KEY]


@pytest.mark.hostile_record("tier access journal")
@given(hostile.records({KEY: [3, 1.7e9], OTHER: [1, 1.7e9]}, max_bytes=4096))
@example(hostile.DEEP)
@example(b'{"' + KEY.encode() + b'":[1,1' + b"0" * 400 + b"]}")
@example(b'{"' + KEY.encode() + b'":[1e400,1]}')
def test_a_hostile_access_journal_is_skipped(tier: LocalTier, data: bytes) -> None:
    tier.prepare()
    tier.tree.check(tier.journal, create=True)
    (tier.journal / "hostile.json").write_bytes(data)
    for accesses in tier.drain_journals():
        for key, (hits, when) in accesses.items():
            assert isinstance(key, str) and isinstance(hits, int) and isinstance(when, float)
    assert not (tier.journal / "hostile.json").exists()  # claimed once, never again


@pytest.mark.hostile_record("tier quick keys")
@given(hostile.records({KEY: [0.01, 4e9], OTHER: [0.02, 4e9]}, max_bytes=65536))
@example(hostile.DEEP)
@example(b'{"' + KEY.encode() + b'":[1,1' + b"0" * 400 + b"]}")
def test_a_hostile_quick_keys_file_is_ignored(data: bytes) -> None:
    written: list[bytes] = []
    quick = QuickKeys("below-threshold.json", lambda: data, written.append)
    secs = quick.get(KEY)
    assert secs is None or isinstance(secs, float)
    quick.remember(OTHER, 0.5)
    quick.save()  # merges what it read: a file it cannot read is replaced, not kept
    again = QuickKeys("below-threshold.json", lambda: written[-1], written.append)
    assert again.get(OTHER) == 0.5
