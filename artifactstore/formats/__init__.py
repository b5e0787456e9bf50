"""What bytes look like: JAX-free and I/O-free formats of the store."""
