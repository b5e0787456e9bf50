"""Runnable examples (`python -m artifactstore.examples.compile_heavy`, `artstore demo`).

Inside the package, not beside it: run from a source checkout, the checkout's
`artifactstore/` comes first on sys.path and shadows the installed one, so the
examples must be in it too.
"""
