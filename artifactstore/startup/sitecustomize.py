"""The startup hook that `artstore warm -- CMD` and `artstore run -- CMD` put first on PYTHONPATH.

Every Python process CMD starts imports it at startup, so the store is activated in each
(`artifactstore_startup`, beside this file, waits for `jax` to be imported), even where
site-packages lacks our .pth file. Any other `sitecustomize` further down sys.path (Debian,
conda) still runs: we must not shadow it. Standard library only; never raises into the
program.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

# Real paths: this directory may be on sys.path twice, once through a symbolic link
# (a symlinked checkout or venv); with mere absolute paths `_chain` would find this very
# file again under the other name and run it, which chains to it again, without end.
_HERE = os.path.dirname(os.path.realpath(__file__))


def _chain() -> None:
    """Run the next `sitecustomize` on sys.path, as Python would have without us."""
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # site.py would print and go on, so do we
        print(f"Error in sitecustomize ({spec.origin}): {exc!r}", file=sys.stderr)


try:
    import artifactstore_startup

    artifactstore_startup.install()
except Exception as exc:
    print(f"artifactstore: startup hook failed ({exc!r})", file=sys.stderr)
_chain()
