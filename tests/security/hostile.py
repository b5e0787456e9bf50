"""Hypothesis strategies for hostile records: what anyone who may write a bucket, a tier or
a bundle can put there (issue 38 item 3).

Every strategy mixes the shapes that broke decoders before: random bytes, records
truncated or padded past their bound, nesting deeper than any record has, and records
that are valid JSON with one or more fields replaced by a hostile value (wrong types,
huge or negative numbers, NaN, another entry's values, path-traversal names, NUL
bytes, unicode) or dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from conftest import TEAM_KEY, TEAM_PUB
from hypothesis import strategies as st

from artifactstore.config import keyfiles
from artifactstore.config.host import compute
from artifactstore.formats import codec
from artifactstore.formats.manifest import Manifest

# Names an attacker would try where a name becomes a path or an object key.
NASTY_TEXT = [
    "",
    "../x",
    "../../etc/passwd",
    "/abs",
    "a/b",
    "x\x00y",
    "\x00",
    "..",
    ".",
    "é" * 40,
    "\u202e",
    "\ud7ff",
    "💥",
    "a" * 300,
    "A" * 64,
    "0" * 64,
    "f" * 40,
    "null",
    " ",
    "\n",
]
NASTY_NUMBERS: list[Any] = [
    -1,
    -(2**63),
    2**63,
    2**64,
    10**400,
    -(10**400),
    1e308,
    -1e308,
    float("inf"),
    float("-inf"),
    float("nan"),
    0,
    0.5,
    True,
    False,
]


def json_values(max_leaves: int = 6) -> st.SearchStrategy[Any]:
    """Any JSON value, hostile leaves likelier than plain ones."""
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=40),
        st.sampled_from(NASTY_TEXT),
        st.sampled_from(NASTY_NUMBERS),
    )
    return st.recursive(
        leaves,
        lambda kids: st.one_of(
            st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def dump(value: Any) -> bytes:
    """JSON as an attacker writes it: NaN and Infinity allowed, unicode unescaped."""
    return json.dumps(value, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")


@st.composite
def altered(
    draw: st.DrawFn, good: dict[str, Any], others: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """`good` with some fields replaced by hostile values or another record's, some
    dropped, maybe an unknown one added: adversarially valid JSON."""
    record = dict(good)
    fields = sorted(good)
    for name in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=len(fields))):
        choices = [json_values(), st.just("__drop__")]
        if others:
            choices.append(st.sampled_from([o[name] for o in others if name in o] or [None]))
        value = draw(st.one_of(*choices))
        if value == "__drop__":
            record.pop(name, None)
        else:
            record[name] = value
    if draw(st.booleans()):
        record[draw(st.sampled_from(NASTY_TEXT))] = draw(json_values(2))
    return record


def nested(prefix: bytes = b"", suffix: bytes = b"") -> st.SearchStrategy[bytes]:
    """Brackets nested deeper than any record is, up to past the parser's recursion limit."""

    def build(args: tuple[int, str]) -> bytes:
        depth, kind = args
        opening, closing = {"list": (b"[", b"]"), "dict": (b'{"a":', b"}")}[kind]
        unbalanced = kind == "dict" and depth % 2
        return prefix + opening * depth + (b"" if unbalanced else closing * depth) + suffix

    depths = st.sampled_from([9, 10, 64, 999, 1001, 5000, 100_000])
    return st.tuples(depths, st.sampled_from(["list", "dict"])).map(build)


def records(
    good: dict[str, Any],
    *,
    max_bytes: int,
    others: Sequence[dict[str, Any]] = (),
    encode: Callable[[Any], bytes] = dump,
) -> st.SearchStrategy[bytes]:
    """Hostile bytes in place of the record `good` (bound `max_bytes`): random, truncated,
    oversized, nested, byte-flipped, or adversarially valid."""
    valid = encode(good)
    head = valid[: max(1, valid.find(b":") + 1)]  # e.g. b'{"v":'

    def flip(args: tuple[int, int]) -> bytes:
        at, bit = args
        data = bytearray(valid)
        data[at % len(data)] ^= 1 << bit
        return bytes(data)

    return st.one_of(
        st.binary(max_size=512),
        st.integers(0, len(valid)).map(lambda n: valid[:n]),
        st.integers(1, 64).map(lambda n: valid + b" " * (max_bytes - len(valid) + n)),
        st.just(b"[" + b"1," * (max_bytes // 2) + b"1]"),
        nested(),
        nested(prefix=head, suffix=b"}"),
        st.tuples(st.integers(0, len(valid)), st.integers(0, 7)).map(flip),
        altered(good, others).map(encode),
        json_values().map(dump),
        st.just(valid.replace(b"{", b'{"v":1,', 1)),  # a duplicate key: the last one wins
    )


def names() -> st.SearchStrategy[str]:
    """Record names a listing might show: ours, nearly ours, and path tricks."""
    return st.one_of(
        st.sampled_from(NASTY_TEXT),
        st.text(max_size=80),
        st.text(alphabet="0123456789abcdef.", min_size=30, max_size=200),
    )


# Shapes every kind's test runs explicitly (`@example`), whatever the draw: past the JSON
# parser's recursion limit, bare and inside a record's first field, and a huge integer.
DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_FIELD = b'{"v":1,"a":' + b"[" * 5000 + b"]" * 5000 + b"}"
HUGE_NUMBER = b'{"v":1,"c":1' + b"0" * 400 + b"}"


# -- the entries the path tests store: two keys, signed by the team tests' key ----------
FP = compute(
    platform_name="cpu",
    platform_version="v",
    device_kind="cpu-test",
    device_count=1,
    jax_version="1",
    jaxlib_version="1",
)
KEY, OTHER = "k" * 64, "o" * 64
PAYLOADS = {KEY: b"the executable stored for KEY" * 8, OTHER: b"another entry's executable" * 8}
SIGNER = keyfiles.load_signing_key(str(TEAM_KEY))
TRUSTED = keyfiles.load_trusted_keys(str(TEAM_PUB))


def signed(key: str, payload: bytes, namespace: str = "default") -> codec.Encoded:
    """`payload`'s object for `key`, signed as the team tests' writers sign."""
    meta = codec.ObjectMeta(key, "jit_f", 1.5, len(payload), "h", FP.to_dict(), callbacks=0)
    return codec.encode(payload, FP.digest, meta, signer=SIGNER, namespace=namespace)


def manifest_of(key: str, encoded: codec.Encoded) -> Manifest:
    return Manifest(
        key,
        encoded.digest,
        FP.digest,
        1.5,
        encoded.raw_size,
        len(encoded.data),
        "jit_f",
        callbacks=0,
        signer=SIGNER.name,
    )
