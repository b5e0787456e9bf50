"""`artstore warm`: fill the store from a CI job so every process after it starts warm.

Two ways in. `warm -- CMD` (`command`) runs CMD unchanged, with the store in
write mode in every Python process it starts: an environment variable plus a
startup hook (`artifactstore/startup`) that activates the store (`child`)
when, and only when, a process imports JAX. `warm MODULE:FUNCTION` (`specs`)
lowers and compiles the listed specializations in worker processes (`worker`)
without running them. Both check first (`preflight`) and end with a `report`.
The parent never imports JAX: one holding a GPU client would take memory the
children need.

Every activated child imports this package, so it defines only what parent and
children share, and imports none of its modules (each imports it): the parent's
functions are imported from theirs (`command.run_command`, `specs.run_specs`,
`preflight.check_store`), by `artstore warm` when it runs.
"""

from __future__ import annotations

import re

from artifactstore.errors import ArtstoreError

__all__ = ["ENV_VAR", "NOT_STORED", "SUMMARY_FIELDS", "TARGET_RE", "WarmError"]

# The report directory, set only by `artstore warm`: activated processes write their
# records there. The startup hook keeps its own copy (it cannot import us).
ENV_VAR = "ARTSTORE_WARM"
# MODULE:FUNCTION, checked by the parent before it starts workers, and by each worker.
TARGET_RE = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")
# What the report shows of a fingerprint after its digest, as children record it.
SUMMARY_FIELDS = (
    "platform",
    "device_kind",
    "device_count",
    "jax_version",
    "jaxlib_version",
    "cpu_arch",
)

# Why something a warming process compiled is not in the store (its records' `why`), and
# what the report says of it: a CI job that warmed nothing must not go green.
NOT_STORED = {
    "write gate": "the write gate refused them: object store and index do not belong "
    "together (ARTSTORE_URL names another store's bucket? the warning above and "
    "`artstore doctor` say why)",
    "role": "the writer's role may not write them (the index's grants or the bucket's "
    "policy): warm with the writer role's credentials",
    "read-only": "the process stores nothing (ARTSTORE_READ_ONLY, or configure(read_only=True) "
    "in the command)",
    "unsigned": "the store requires signatures and ARTSTORE_SIGNING_KEY is not set (a "
    "typo in its name? the warning above says): set it to the writer's key",
    "quota": "a quota of the object store or database refused them",
    "upload": "their upload failed (the warning above says why)",
    "threshold": "compiled under ARTSTORE_MIN_COMPILE_SECS (the command configured a "
    "threshold: warm stores everything unless told otherwise)",
    "unloadable": "an entry of their key is stored but JAX could not load it here, and a "
    "compile does not replace it (`artstore rm KEY`, then warm again)",
    "signature": "an entry of their key is stored but refused here for its signature: set "
    "ARTSTORE_SIGNING_KEY to replace it with a signed one",
}


class WarmError(ArtstoreError):
    """`artstore warm` cannot start or its input is wrong; one line for the user."""
