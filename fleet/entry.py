"""The ``edge-fleet`` console script: :func:`fleet.cli.main`, or one line when the extra is missing.

The fleet service needs the ``fleet`` extra (FastAPI, SQLAlchemy, alembic, uvicorn...), which a
gateway install (``pip install edge-anomaly-agent``) leaves out. Without it, importing
:mod:`fleet.cli` fails on its first third-party import; this module imports it lazily and turns
that failure into one line on stderr and exit code 69 (``EX_UNAVAILABLE``, BSD ``sysexits.h``)::

    edge-fleet needs the fleet extra: pip install 'edge-anomaly-agent[fleet]'

A missing module that the fleet extra does not install is a bug, not an install problem: its
traceback is left alone.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

#: sysexits.h EX_UNAVAILABLE (as :data:`fleet.cli.EX_UNAVAILABLE`, which cannot be imported here).
EX_UNAVAILABLE = 69

#: The message printed (on stderr) when a module of the fleet extra is missing.
MISSING_EXTRA = "edge-fleet needs the fleet extra: pip install 'edge-anomaly-agent[fleet]'"

#: Top-level import names of the ``fleet`` extra's requirements (setup.cfg) and of the modules
#: they bring that :mod:`fleet` imports itself (starlette: FastAPI's; httptools:
#: uvicorn[standard]'s).
FLEET_EXTRA_MODULES = frozenset({
    "alembic",
    "argon2",
    "cachetools",
    "fastapi",
    "httptools",
    "msgspec",
    "onnx",
    "PIL",
    "psycopg",
    "sqlalchemy",
    "starlette",
    "swagger_ui_bundle",
    "tqdm",
    "uvicorn",
})


def missing_extra_module(exc: ModuleNotFoundError) -> str | None:
    """The fleet-extra module ``exc`` is about (its top-level name), or None for any other module.

    >>> missing_extra_module(ModuleNotFoundError("no sqlalchemy.orm", name="sqlalchemy.orm"))
    'sqlalchemy'
    >>> missing_extra_module(ModuleNotFoundError("no fleet.nope", name="fleet.nope"))
    """
    top = (exc.name or "").split(".", 1)[0]
    return top if top in FLEET_EXTRA_MODULES else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``edge-fleet`` (:func:`fleet.cli.main`); returns its exit code, or 69 without the extra.

    The lazy imports :func:`fleet.cli.main` makes per command are covered too: a missing fleet-extra
    module at any point prints :data:`MISSING_EXTRA` once and returns :data:`EX_UNAVAILABLE`.
    """
    try:
        from fleet import cli  # noqa: PLC0415 (the point of this module: import lazily)

        return cli.main(argv)
    except ModuleNotFoundError as exc:
        if missing_extra_module(exc) is None:
            raise
        print(f"{MISSING_EXTRA} (no module named {exc.name!r})", file=sys.stderr)
        return EX_UNAVAILABLE


if __name__ == "__main__":  # pragma: no cover (python -m fleet.entry)
    sys.exit(main())
