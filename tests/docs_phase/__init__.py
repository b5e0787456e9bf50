"""The docs phase: README and docs/ run as a newcomer runs them (pages.py, test_pages.py)."""
