"""Named executables: compiled functions stored under a name and version.

This package is JAX-free (keys, the call signature and the payload container);
`artifactstore.jaxhook.named` builds and loads them with JAX. A named executable is
an ordinary store entry, so signing, digests, tiers, gc, pull and bundles treat it
like any other: only its key and module name follow the convention in `keys`.
"""
