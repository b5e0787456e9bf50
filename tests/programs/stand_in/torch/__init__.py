"""The stand-in torch the stand-in torch_xla goes with (its version is in the fingerprint)."""

__version__ = "0.0+stand-in"
