"""Build hook: the wheel ships the builtin model packages as ``agent/builtin_models/<name>``.

Everything else is declared in setup.cfg. The packages stay in ``models/`` at the top of the
repository (the recipes write them there and a checkout reads them there); ``build_py`` copies
the ones named in ``agent.config.builtin_models.SHIPPED_IN_WHEEL`` into the built ``agent``
package, where :func:`agent.config.builtin_models.package_models_dir` finds them. Editable
installs copy nothing: they resolve ``builtin:`` names to the checkout's ``models/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def shipped_names() -> tuple[str, ...]:
    """``SHIPPED_IN_WHEEL`` read from agent/config/builtin_models.py without importing it."""
    tree = ast.parse((ROOT / "agent" / "config" / "builtin_models.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "SHIPPED_IN_WHEEL" for t in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError("SHIPPED_IN_WHEEL not found in agent/config/builtin_models.py")


class BuildPyWithModels(build_py):
    """``build_py`` that also copies ``models/<name>/*`` to ``<build_lib>/agent/builtin_models``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for name in shipped_names():
            src = ROOT / "models" / name
            if not (src / "manifest.json").is_file():
                raise RuntimeError(f"builtin model package {src} has no manifest.json")
            dst = Path(self.build_lib) / "agent" / "builtin_models" / name
            self.mkpath(str(dst))
            for path in sorted(src.iterdir()):
                if path.is_file():
                    self.copy_file(str(path), str(dst / path.name))


setup(cmdclass={"build_py": BuildPyWithModels})
