"""Where ``builtin:<name>`` model packages come from: a checkout, the installed wheel, or a folder.

Lookup order for ``builtin:<name>`` (first match wins):

1. ``$EDGE_AGENT_MODELS_DIR/<name>`` when that variable is set and not empty (the systemd unit
   sets ``/opt/edge-agent/models``).
2. ``<checkout>/models/<name>``: the ``models/`` directory next to the ``agent`` package, so a
   development checkout (editable install or ``PYTHONPATH``) uses the packages it builds.
3. ``agent/builtin_models/<name>`` inside the installed package (found with
   :mod:`importlib.resources`): the packages the wheel ships (:data:`SHIPPED_IN_WHEEL`; the
   build hook in ``setup.py`` copies them there from ``models/``).

A name found in none of them resolves to the first candidate that would have been looked at, so
the package loader reports a missing ``manifest.json`` at a path the user can act on.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

#: Environment variable naming another directory for ``builtin:`` models (an installed agent:
#: ``/opt/edge-agent/models``, set by the systemd unit).
MODELS_DIR_ENV = "EDGE_AGENT_MODELS_DIR"

#: ``<checkout>/models``: the repository's model packages (exists only in a checkout).
CHECKOUT_MODELS_DIR = Path(__file__).resolve().parents[2] / "models"

#: Sub-directory of the ``agent`` package holding the model packages a wheel ships.
PACKAGE_DATA_DIR = "builtin_models"

#: The model packages copied into the wheel: the default sensor model and the one-channel
#: model for univariate streams. The image model (``mtd-patchcore``, about 25 MB:
#: every artefact is listed with its sha256 in the signed manifest, so none can be left out)
#: is not shipped: it comes from a checkout, ``$EDGE_AGENT_MODELS_DIR`` or a fleet rollout.
SHIPPED_IN_WHEEL = ("skab-wstat", "univariate-wstat")
#: Every builtin package the project makes, the ones the wheel lacks included: ``edge-agent
#: models`` lists one that is not found with :func:`how_to_get` (a wheel install lacks
#: ``mtd-patchcore``).
KNOWN_BUILTINS = ("mtd-patchcore", *SHIPPED_IN_WHEEL)


def package_models_dir() -> Path | None:
    """``agent/builtin_models`` of the imported ``agent`` package, or None when absent.

    None in a checkout (the directory exists only in an installed wheel) and for an ``agent``
    package that is not on a file system (a zip import: model packages need real files).
    """
    root = resources.files("agent") / PACKAGE_DATA_DIR
    if isinstance(root, Path) and root.is_dir():
        return root
    return None


def builtin_candidates(name: str) -> list[Path]:
    """Directories that may hold the builtin package ``name``, in lookup order.

    Args:
        name: A builtin package name, already checked to be one path component.

    Returns:
        ``$EDGE_AGENT_MODELS_DIR/name`` when the variable is set and not empty, then the
        checkout's ``models/name`` (when a checkout is there), then the wheel's
        ``agent/builtin_models/name`` (when installed from a wheel). Never empty: with none
        of them, the checkout path.
    """
    found = [root / name for root in _roots()]
    return found or [CHECKOUT_MODELS_DIR / name]


def _roots() -> list[Path]:
    """The directories looked in, in order: the variable's, the checkout's, the wheel's."""
    env_dir = os.environ.get(MODELS_DIR_ENV, "")
    roots = [Path(env_dir)] if env_dir else []
    if CHECKOUT_MODELS_DIR.is_dir():
        roots.append(CHECKOUT_MODELS_DIR)
    shipped = package_models_dir()
    if shipped is not None:
        roots.append(shipped)
    return roots


def find_builtin(name: str) -> Path:
    """The directory of the builtin package ``name``: the first candidate holding a manifest.

    Args:
        name: A builtin package name, already checked to be one path component.

    Returns:
        The first of :func:`builtin_candidates` containing ``manifest.json``, else the first
        candidate (the package loader then raises its missing-manifest error there).
    """
    candidates = builtin_candidates(name)
    for path in candidates:
        if (path / "manifest.json").is_file():
            return path
    return candidates[0]


def not_found_problem(path: Path) -> str | None:
    """Why the resolved builtin package ``path`` cannot be loaded; None when it is not a builtin.

    Args:
        path: A resolved stream model (``AgentConfig.resolved``).

    Returns:
        None when ``path`` holds ``manifest.json`` or is not in a directory ``builtin:`` names
        are looked up in; else e.g. ``"no model package at /a/mtd-patchcore (builtin packages
        found: builtin:skab-wstat; ...)"``, naming where to read more.
    """
    if (path / "manifest.json").is_file() or path.parent not in _roots():
        return None
    there = ", ".join(f"builtin:{n}" for n in available_builtins()) or "none"
    return f"no model package at {path} (builtin packages found: {there}; {how_to_get(path.name)})"


def how_to_get(name: str) -> str:
    """What to do about the builtin package ``name`` that this install lacks.

    >>> print(how_to_get("mtd-patchcore"))  # doctest: +NORMALIZE_WHITESPACE
    builtin:mtd-patchcore is not in the wheel: copy models/mtd-patchcore from a checkout into
    a directory DIR and set EDGE_AGENT_MODELS_DIR=DIR, or give the package directory's path as
    the stream's model (docs/install.md)
    >>> print(how_to_get("mtd-patchcor"))
    builtin:mtd-patchcor is no package this project makes: `edge-agent models` lists them
    """
    if name not in KNOWN_BUILTINS:
        return f"builtin:{name} is no package this project makes: `edge-agent models` lists them"
    where = "is not in the wheel" if name not in SHIPPED_IN_WHEEL else "is not installed here"
    return (f"builtin:{name} {where}: copy models/{name} from a checkout into a directory DIR "
            f"and set {MODELS_DIR_ENV}=DIR, or give the package directory's path as the "
            "stream's model (docs/install.md)")


def absent_builtins() -> list[str]:
    """The names of :data:`KNOWN_BUILTINS` that no lookup directory holds, sorted."""
    found = available_builtins()
    return sorted(name for name in KNOWN_BUILTINS if name not in found)


def available_builtins() -> dict[str, Path]:
    """Every builtin package name found, mapped to the directory it resolves to.

    Returns:
        ``{name: directory}`` over the directories of :func:`builtin_candidates`, sorted by
        name; a directory counts when it holds ``manifest.json``.
    """
    names = {
        child.name
        for root in _roots() if root.is_dir()
        for child in root.iterdir() if (child / "manifest.json").is_file()
    }
    return {name: find_builtin(name) for name in sorted(names)}
