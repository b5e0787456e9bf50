"""Signing and verifying cost per entry, for 1 MB and 100 MB executables (issue 15).

Each configuration encodes (what a writer does before its upload) and decodes (what
a reader does before it hands bytes to JAX) the same incompressible-ish payload:
  unsigned    digest + fingerprint checks only (the baseline)
  signed      a writer with ARTSTORE_SIGNING_KEY; a reader with ARTSTORE_TRUSTED_KEYS
Rounds interleave the two, so both see the same noise; the table gives medians and
the signed/unsigned ratio. The signature covers the entry's digest, not its bytes,
so its cost is constant per entry while hashing grows with size.

    python bench/signing_cost.py [--rounds 9] [--out bench/results/signing_cost.json]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results

from artifactstore.config import keyfiles
from artifactstore.config.host import compute
from artifactstore.formats import codec
from artifactstore.formats.put import Put

SIZES = {"1MB": 10**6, "100MB": 100 * 10**6}
KEY = "f" * 64
NAMESPACE = "bench"
HOST = socket.gethostname()  # as the writer names it


def _payload(size: int) -> bytes:
    """Half random, half repetitive: compresses about as a real executable does."""
    half = size // 2
    return (os.urandom(half) + bytes(range(256)) * ((size - half) // 256 + 1))[:size]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=_results.default_out("signing_cost"))
    args = parser.parse_args()
    fp = compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                 device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        secret, public = keyfiles.generate("bench", tmp)
        key = keyfiles.load_signing_key(secret)
        trusted = keyfiles.load_trusted_keys(str(public))
    configs = (("unsigned", None, None), ("signed", key, trusted))
    samples: dict[str, dict[str, list[float]]] = {}
    for label, size in SIZES.items():
        payload = _payload(size)
        for config, _, _ in configs:
            samples[f"{label} {config}"] = {"encode_secs": [], "decode_secs": []}
        for _ in range(args.rounds):
            for config, signer, readers_keys in configs:
                s = samples[f"{label} {config}"]
                start = time.perf_counter()
                put = Put(KEY, payload, fp, "m", 1.0, producer_host=HOST)
                enc = put.encoded(signer=signer, namespace=NAMESPACE)
                s["encode_secs"].append(time.perf_counter() - start)
                start = time.perf_counter()
                codec.decode(enc.data, digest=enc.digest, fingerprint=fp.digest,
                             key=KEY, raw_size=size, trusted=readers_keys,
                             namespace=NAMESPACE)  # fmt: skip
                s["decode_secs"].append(time.perf_counter() - start)
    res = {name: {m: _results.summary(v) for m, v in s.items()} for name, s in samples.items()}
    ratio_cols = [
        ("encode vs unsigned", "encode_secs", ""),
        ("decode vs unsigned", "decode_secs", ""),
    ]
    lines = [f"{'config':<16}{'encode s (min-max)':>26}{'decode s (min-max)':>26}"
             f"{'encode x':>12}{'decode x':>12}{'sign+verify ms':>16}"]  # fmt: skip
    for name, r in res.items():
        base = res[name.split()[0] + " unsigned"]
        r["ratios"] = {h: r[k]["median"] / base[k]["median"] for h, k, _ in ratio_cols}
        extra_ms = 1000 * sum(r[k]["median"] - base[k]["median"] for _, k, _ in ratio_cols)
        r["extra_ms"] = extra_ms
        cells = [f"{r[k]['median']:.4f} ({r[k]['min']:.4f}-{r[k]['max']:.4f})"
                 for k in ("encode_secs", "decode_secs")]  # fmt: skip
        lines.append(f"{name:<16}{cells[0]:>26}{cells[1]:>26}"
                     f"{r['ratios']['encode vs unsigned']:>11.3f}x"
                     f"{r['ratios']['decode vs unsigned']:>11.3f}x{extra_ms:>16.2f}")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    _results.write(args.out, {"run": _results.run_info(), "rounds": args.rounds,
                              "results": res}, text)  # fmt: skip


if __name__ == "__main__":
    main()
