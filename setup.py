"""Ships the startup hook at the top of site-packages; everything else is in pyproject.toml.

`artifactstore_startup.pth` (one line: it imports `artifactstore_startup` only when an
ARTSTORE_* variable is set) and the module it imports must sit at the root of
site-packages, which no pyproject.toml table can express; coverage.py and pytest-cov ship
their .pth files the same way. Both regular and editable (`pip install -e`) installs get
them; an editable install gets a copy of the module, so reinstall after editing it.
"""

from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

STARTUP = Path(__file__).resolve().parent / "artifactstore" / "startup"
TOP_LEVEL = [STARTUP / "artifactstore_startup.pth", STARTUP / "artifactstore_startup.py"]


class BuildPyWithStartup(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            for path in TOP_LEVEL:
                self.copy_file(str(path), str(Path(self.build_lib) / path.name))


class _WithStartup:
    """Wraps setuptools' editable strategy: the same wheel, plus the top-level files."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, wheel: Any, files: Any, mapping: Any) -> None:
        self.inner(wheel, files, mapping)
        for path in TOP_LEVEL:
            wheel.writestr(path.name, path.read_bytes())

    def __enter__(self) -> "_WithStartup":
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self.inner.__exit__(*exc)


class EditableWheelWithStartup(editable_wheel):
    def _select_strategy(self, *args: Any, **kwargs: Any) -> Any:
        return _WithStartup(super()._select_strategy(*args, **kwargs))


setup(cmdclass={"build_py": BuildPyWithStartup, "editable_wheel": EditableWheelWithStartup})
