"""What serves the whole process, below the store: the one background executor
(`background`) and its ordered lanes (`lanes`), a circuit breaker per backend
(`breaker`), warnings said once (`notices`), and the one counting object
(`counters`). Nothing here opens a store; the store, the session and the
frameworks' adapters build on it."""
