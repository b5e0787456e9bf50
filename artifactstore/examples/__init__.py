"""Runnable examples (installed as artifactstore.examples so `artstore demo` can run them)."""
