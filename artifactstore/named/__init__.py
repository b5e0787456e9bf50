"""Named executables: compiled functions stored under a name and version.

Without JAX (importing them loads none): `keys` (the key and module-name convention),
`signature` (the call signature trees), `container` (the stored payload) and `spec`
(`NamedSpec`, for `artstore warm`). With JAX: `api` (`compiled`, `load`), `context`
(lookup and store), `build`, `call` (`NamedExecutable`) and `portable` (the
`jax.export` form). A named executable is an ordinary store entry, so signing,
digests, tiers, gc, pull and bundles treat it like any other: only its key and
module name follow the convention in `keys`.
"""
