"""Base class for every config model: strict, unknown keys rejected, descriptions required."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A pydantic model that rejects unknown keys and does not coerce types.

    Every field of a subclass carries a ``description``; the default config and the docs are
    generated from them.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, validate_default=True)
