"""Validate-only twins of pydantic models: the same checks, no model instances built.

Validating 5,000 ingest records with :class:`pydantic.TypeAdapter` over the wire models of
:mod:`cloud_sync.protocol` builds ~35,000 model instances (record, body, each channel); building
them, not checking, is most of the cost (~2 us per instance). :func:`checker` rewrites a type's
pydantic-core schema so that every ``model`` node becomes a ``typed-dict`` node with the very same
field schemas (types, constraints, patterns, aliases, defaults, ``extra="forbid"``), compiles it
with :class:`pydantic_core.SchemaValidator`, and so checks a document ~4x faster, returning plain
dicts keyed by the wire names (aliases). The schema is derived from the models at import time,
so it cannot drift from them; a
model with validators of its own (``function-*`` schema nodes, which expect the model instance)
is refused rather than half-checked.

With ``storable=True`` the twin is also stricter than the models where a database is: integers
must fit int64 and floats must be finite and within +-2**63 (whether written as floats or as
integers). A document passing that twin holds no value :func:`fleet.ingest.unstorable` would
refuse, except NUL characters in strings (checked on the raw body instead). Failing only these
extra bounds is fine for the caller, which then takes its slow, per-record path.

The node shapes used are the public :mod:`pydantic_core.core_schema` ones (``model``,
``model-fields``, ``model-field`` -> ``typed-dict``, ``typed-dict-field``; ``int``/``float``
bounds).
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from pydantic_core import SchemaValidator

_FUNCTIONS = ("function-before", "function-after", "function-wrap", "function-plain")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FLOAT_BOUND = float(2**63)


def checker(tp: Any, *, storable: bool = False) -> SchemaValidator:
    """A validator accepting exactly what ``TypeAdapter(tp)`` accepts, producing dicts.

    Args:
        tp: A type built from pydantic models, lists, unions, literals, ...
        storable: Also refuse numbers a database cannot store (module docstring).

    Returns:
        A :class:`pydantic_core.SchemaValidator`; its ``validate_python`` raises
        :class:`pydantic_core.ValidationError` like the adapter's (same locations and messages).

    Raises:
        ValueError: A model in ``tp`` has validators of its own (see the module docstring).
    """
    schema = TypeAdapter(tp).core_schema
    return SchemaValidator(_rewrite(schema, storable))


def _rewrite(node: Any, storable: bool) -> Any:
    if isinstance(node, list):
        return [_rewrite(item, storable) for item in node]
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind in _FUNCTIONS:
        raise ValueError(f"cannot mirror a schema with a {kind} validator")
    if kind == "model":
        return _typed_dict(node, storable)
    out = {key: _rewrite(value, storable) for key, value in node.items()}
    if storable and kind == "int":
        out["ge"] = max(out.get("ge", _INT64_MIN), _INT64_MIN)
        out["le"] = min(out.get("le", _INT64_MAX), _INT64_MAX)
    elif storable and kind == "float":
        out["allow_inf_nan"] = False
        out["ge"] = max(out.get("ge", -_FLOAT_BOUND), -_FLOAT_BOUND)
        out["le"] = min(out.get("le", _FLOAT_BOUND), _FLOAT_BOUND)
    return out


def _typed_dict(model: dict[str, Any], storable: bool) -> dict[str, Any]:
    inner = model["schema"]
    if inner.get("type") != "model-fields" or inner.get("computed_fields"):
        raise ValueError(f"cannot mirror model schema {inner.get('type')!r}")
    fields: dict[str, Any] = {}
    for name, field in inner["fields"].items():
        out: dict[str, Any] = {
            "type": "typed-dict-field",
            "schema": _rewrite(field["schema"], storable),
            "required": field["schema"].get("type") != "default",
        }
        alias = field.get("validation_alias")
        key = name
        if isinstance(alias, str):
            key = alias  # the wire name is the key, in and out (e.g. "schema", not "schema_")
        elif alias is not None:
            out["validation_alias"] = alias
        fields[key] = out
    config = model.get("config", {})
    td: dict[str, Any] = {
        "type": "typed-dict",
        "fields": fields,
        "extra_behavior": config.get("extra_fields_behavior", "ignore"),
    }
    if "ref" in model:
        td["ref"] = model["ref"]
    return td
