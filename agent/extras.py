"""The optional extras of ``edge-anomaly-agent``: what to run to install one, and whether it is.

A gateway installs the wheel (``pip install edge-anomaly-agent``) and the extras its config
needs (``camera``, ``modbus``, ``opcua``, ``sparkplug``, ``openvino``, ``litert``; setup.cfg).
A developer uses ``pip install -e '.[camera]'`` in a checkout. Every message that names a
missing extra gives both, through :func:`install_hint`.
"""

from __future__ import annotations

import importlib

DIST = "edge-anomaly-agent"


def install_hint(extra: str) -> str:
    """The command that installs ``extra``, for a wheel install and for a checkout.

    >>> install_hint("camera")
    "pip install 'edge-anomaly-agent[camera]' (or pip install -e '.[camera]' in a checkout)"
    """
    return f"pip install '{DIST}[{extra}]' (or pip install -e '.[{extra}]' in a checkout)"


def missing_module(module: str, what: str, extra: str) -> str | None:
    """Import ``module`` as ``run`` would; a one-line problem when it fails, else None.

    Args:
        module: The import name (``"cv2"``, ``"PIL"``).
        what: The name a user knows it by (``"OpenCV"``, ``"Pillow"``).
        extra: The extra that installs it.

    Returns:
        ``"<what> is not installed (<error>): <install hint>"`` or None. An import that fails
        for another reason than absence (a shared library OpenCV links against) is a problem too.

    >>> missing_module("json", "json", "camera") is None
    True
    >>> missing_module("no_such_module_xyz", "XYZ", "camera")  # doctest: +ELLIPSIS
    "XYZ is not installed (No module named 'no_such_module_xyz'): pip install 'edge-anomaly-...
    """
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return f"{what} is not installed ({exc}): {install_hint(extra)}"
    return None
