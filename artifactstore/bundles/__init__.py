"""Bundles: chosen entries of a store as one file, for clusters that cannot reach it.

`export` writes a zstd-compressed tar of the entries' objects (as stored: signed,
never re-encoded) and a manifest of their records (the format: `formats.bundle`);
`importer` verifies a whole bundle before any of it enters a store, then stores it
through the store's own write path. Air-gapped clusters carry their executables in as a file.
"""
