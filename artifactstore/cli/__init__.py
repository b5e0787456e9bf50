"""`artstore`: the operator's command line (`app` holds the group and `main`).

Commands live by what they act on (`entries`, `gc_cmd`, `warm_cmd`, `setup_cmd`,
with `demo` and `doctor` as the logic of two of them); all of them print through
`render`, and `gc` streams its output through `gc_output`.
"""

from artifactstore.cli.app import cli, main

__all__ = ["cli", "main"]
