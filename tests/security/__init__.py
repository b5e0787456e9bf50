"""Issue 29: each attack or operator mistake as a test that failed before its fix."""
