"""A native module's calling convention: what is stored beside its bytes, as JSON.

The module's entry function (`main`) takes the named function's array inputs
flattened in its pytree order (static arguments are baked in) and returns its outputs
flattened as `jax.export` orders them. The trees are `named.signature`'s declarative
JSON (never pickle), so a program without Python's JAX (or without Python) can
rebuild them. Also: the StableHLO it came from, the target and CPU it was built for,
the compiler, and what the check against XLA measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from artifactstore.errors import CorruptObject
from artifactstore.formats import native as native_format
from artifactstore.named.signature import Signature

FUNCTION = "main"
MODULE = "module"  # IREE's name of the module (native.lower names it): `module.main`


@dataclass(frozen=True)
class Convention:
    """How to call one native module, and where it came from."""

    name: str
    version: str
    inputs: Signature  # the named function's inputs (static ones as `{"static": v}`)
    outputs: Signature
    stablehlo: str  # sha256 of the portable form it was compiled from
    target: str
    cpu: str  # generic, host or features
    cpu_arch: str
    cpu_features: tuple[str, ...]
    compiler: str  # IREE compiler version
    function: str = FUNCTION
    check: list[dict[str, Any]] = field(default_factory=list)  # per output: the difference

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "function": self.function,
            "inputs": self.inputs.to_json(),
            "outputs": self.outputs.to_json(),
            "stablehlo": self.stablehlo,
            "target": self.target,
            "cpu": self.cpu,
            "cpu_arch": self.cpu_arch,
            "cpu_features": list(self.cpu_features),
            "compiler": self.compiler,
            "check": self.check,
        }

    @classmethod
    def from_json(cls, data: Any) -> Convention:
        """CorruptObject for anything that is not a convention (untrusted, as read)."""
        try:
            features = data.get("cpu_features", [])
            if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
                raise ValueError("malformed cpu_features")
            check = data.get("check", [])
            if not isinstance(check, list):
                raise ValueError("malformed check")
            for name in ("name", "version", "function", "stablehlo", "target", "cpu"):
                if not isinstance(data.get(name), str):
                    raise ValueError(f"malformed {name}")
            return cls(
                name=data["name"],
                version=data["version"],
                inputs=Signature.from_json(data.get("inputs")),
                outputs=Signature.from_json(data.get("outputs")),
                stablehlo=data["stablehlo"],
                target=data["target"],
                cpu=data["cpu"],
                cpu_arch=str(data.get("cpu_arch", "")),
                cpu_features=tuple(features),
                compiler=str(data.get("compiler", "")),
                function=data["function"],
                check=check,
            )
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise CorruptObject(f"malformed native calling convention: {exc}") from exc

    def dynamic_inputs(self) -> list[dict[str, Any]]:
        """The module's arguments, in order: shape and dtype of each."""
        return [{"shape": list(x.shape), "dtype": x.dtype} for x in self.inputs.leaves]

    def describe_json(self) -> dict[str, Any]:
        """What `artstore native get` writes beside the module (`<name>.json`)."""
        return {
            **self.to_json(),
            "module": MODULE,
            "entry": f"{MODULE}.{self.function}",
            "module_inputs": self.dynamic_inputs(),
            "module_outputs": [
                {"shape": list(x.shape), "dtype": x.dtype} for x in self.outputs.leaves
            ],
        }


def encode(convention: Convention, module: bytes) -> bytes:
    return native_format.frame(convention.to_json(), module)


def decode(payload: bytes) -> tuple[Convention, bytes]:
    """(convention, module bytes); CorruptObject for anything else."""
    raw, body = native_format.unframe(payload)
    return Convention.from_json(raw), body
