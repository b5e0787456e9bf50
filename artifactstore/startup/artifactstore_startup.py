"""Activates artifactstore from the environment in any Python process, before its program runs.

`install()` runs at interpreter start, from `artifactstore_startup.pth` in site-packages
(only when an `ARTSTORE_*` variable is set: a process without one pays a look at the
environment's names; never in `python -I` or `-E`, which promise to ignore the environment)
and from the `sitecustomize` beside this file, which `artstore warm`
and `artstore run` put first on PYTHONPATH; importing the module does nothing (`artstore
doctor` reads `mode()`). It then waits for `jax` to be imported (a meta path finder, so a
process that never imports JAX, such as pip, loads nothing of artifactstore or JAX) and
activates the store once; likewise for `torch_xla`, whose persistent cache the store then
serves (`artifactstore.torch_xla`, the same settings; imported only by such a program):

- ARTSTORE_WARM set (`artstore warm -- CMD`): write mode, recorded for warm's report;
- otherwise ARTSTORE_URL set or ARTSTORE_ACTIVATE=1: the store as `configure()` with the
  environment's settings would (`artifactstore.jaxhook.environment`); an explicit
  `configure()` in the program wins;
- ARTSTORE_ACTIVATE=0: none of this, for this process (read again when JAX is imported,
  so a program or a conftest.py can set it before importing JAX);
- none of them, but other `ARTSTORE_*` names: the store stays off, and where one of those
  names is none of ours (a mistyped ARTSTORE_URL), one line says so when JAX is imported,
  naming the variable probably meant (`artifactstore.config.variables.off_line`, imported
  only then: a process that never imports JAX, pip say, loads nothing and says nothing).

A top-level module, standard library only, because it runs in every such process and may
run where artifactstore is not importable at all; it never raises into the program.
PYTEST_DONT_REWRITE: the .pth file imports it before pytest could rewrite it.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType

# Not importlib.abc nor typing: they would cost every such process ~15 ms at start-up,
# more than the rest of it together (bench/activation.py).

# Copies of the names in artifactstore.warm and artifactstore.runtime.summary (a unit test keeps
# them equal): this module cannot import the package before JAX is imported.
WARM_VAR = "ARTSTORE_WARM"
ACTIVATE_VAR = "ARTSTORE_ACTIVATE"
URL_VAR = "ARTSTORE_URL"
PREFIX = "ARTSTORE_"
OFF = "off"  # how: nothing turns the store on, though ARTSTORE_* names are set
_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off"})


def mode(environ: os._Environ[str] | dict[str, str] = os.environ) -> str | None:
    """'warm', 'environment' or None (not activated), from the environment alone."""
    activate = environ.get(ACTIVATE_VAR, "").strip().lower()
    if activate in _OFF:
        return None
    if activate and activate not in _ON:
        print(
            f"artifactstore: {ACTIVATE_VAR}={environ.get(ACTIVATE_VAR)!r} is neither 1 nor 0; "
            "not activating the store (set it to 1 or 0)",
            file=sys.stderr,
        )
        return None
    if environ.get(WARM_VAR):
        return "warm"
    if activate or environ.get(URL_VAR):
        return "environment"
    return None


def unasked(environ: os._Environ[str] | dict[str, str] = os.environ) -> bool:
    """Whether `ARTSTORE_*` names are set, yet none turns the store on or off: no
    ARTSTORE_URL, ARTSTORE_ACTIVATE or ARTSTORE_WARM (a typo in one of them, say)."""
    if environ.get(ACTIVATE_VAR, "").strip() or environ.get(WARM_VAR) or environ.get(URL_VAR):
        return False
    return any(name.startswith(PREFIX) for name in environ)


# The modules whose import activates the store: JAX, and torch-xla's adapter.
WATCHED = ("jax", "torch_xla")


def _activate(how: str, module: str = "jax") -> None:
    if how == OFF:
        _say_off()
        return
    if mode() is None:  # ARTSTORE_ACTIVATE=0 set by the program itself before importing JAX
        return
    try:
        if module == "torch_xla":
            from artifactstore.torch_xla import adapter

            adapter.enable({}, explicit=False)
        elif how == "warm":
            from artifactstore.warm import child

            child.activate()
        else:
            from artifactstore.jaxhook import environment

            environment.activate()
    except Exception as exc:
        print(
            f"artifactstore: could not activate the store in {sys.executable} ({exc!r}); "
            "compiling as usual",
            file=sys.stderr,
        )


_said_off = False


def _say_off() -> None:
    """The one line of a process whose store is off where an ARTSTORE_* typo is set."""
    global _said_off
    if _said_off or not unasked():  # said, or the program has set the switch since
        return
    _said_off = True
    try:
        from artifactstore.config.variables import off_line

        line = off_line()
    except Exception:  # artifactstore not importable: nothing to compare the names with
        return
    if line:
        print(f"artifactstore: {line}", file=sys.stderr)


class _Loader:
    """Delegates to the module's own loader and activates the store once it is imported
    (a loader by protocol: create_module and exec_module)."""

    def __init__(self, inner: object, how: str, module: str = "jax") -> None:
        self._inner = inner
        self._how = how
        self._module = module

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = getattr(self._inner, "create_module")(spec)  # noqa: B009
        return module

    def exec_module(self, module: ModuleType) -> None:
        getattr(self._inner, "exec_module")(module)  # noqa: B009
        _activate(self._how, self._module)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


class _JaxImportHook:
    """A meta path finder (by protocol) that sees `jax` and `torch_xla` being imported,
    and leaves once both were."""

    def __init__(self, how: str, waiting: tuple[str, ...] = WATCHED) -> None:
        self.how = how
        self.waiting = [name for name in waiting if name not in sys.modules]

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self.waiting:
            return None
        self.waiting.remove(fullname)
        if not self.waiting:
            sys.meta_path.remove(self)  # type: ignore[arg-type]
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec: ModuleSpec | None = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    loader = _Loader(spec.loader, self.how, fullname)
                    spec.loader = loader  # type: ignore[assignment]
                return spec
        return None


_installed = False
_disabled = False


def install() -> None:
    """Wait for `jax` if the environment activates the store; once per process, however
    many ways in (the .pth file and the sitecustomize, a venv's lib64 link to lib)."""
    global _installed
    if _installed:
        return
    _installed = True
    if sys.flags.ignore_environment or sys.flags.isolated:  # -E, -I: no ARTSTORE_* applies
        return
    try:
        how = mode()
        if how is None and unasked():
            how = OFF
        if how is not None:
            arm(how)
    except Exception as exc:  # never into the program
        print(f"artifactstore: startup hook failed ({exc!r})", file=sys.stderr)


def arm(how: str) -> None:
    """Activate `how` once `jax` (and `torch_xla`) is imported, or now for one that
    already is (an earlier startup hook imported it, or the pytest plugin arms this late)."""
    if _disabled:
        return
    for module in WATCHED:
        if module in sys.modules:
            _activate(how, module)
    if all(m in sys.modules for m in WATCHED):
        return
    armed = [f for f in sys.meta_path if isinstance(f, _JaxImportHook)]
    if not armed:
        sys.meta_path.insert(0, _JaxImportHook(how))  # type: ignore[arg-type]
    elif armed[0].how == OFF:  # the pytest plugin turns on what nothing had
        armed[0].how = how


def disable() -> None:
    """Not in this process (the `artstore` command line: its JAX is not a program's)."""
    global _disabled
    _disabled = True
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _JaxImportHook)]
