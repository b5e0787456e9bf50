"""One process's use of the store: its session, its summary, commands it runs."""
