"""Load the agent config from TOML, and write the default config from the schema.

Loading is four steps, and every problem of every step is collected before anything is raised,
so one run of ``edge-agent check-config`` shows all of them:

1. read the file as UTF-8 and parse it with :mod:`tomllib` (syntax errors name line and column;
   values nested past the interpreter's recursion limit are one problem, not a crash);
2. substitute the environment in every string value: ``${VAR}`` (a missing ``VAR`` is a problem
   at that key), ``${VAR:-default}`` (``default`` when ``VAR`` is unset or empty) and ``$${``
   for a literal ``${``. Only strings are substituted: a number or boolean cannot come from the
   environment (strict types);
3. validate against :class:`agent.config.schema.AgentConfig`;
4. turn every pydantic error into ``key.path: message``, e.g.
   ``streams[0].source.baudrate: Input should be greater than 0`` or ``mqtt.hots: unknown key``.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import textwrap
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import tomli_w
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (Ubuntu 22.04): tomllib's backport, the same parser (setup.cfg)
    import tomli as tomllib

from agent.config.schema import AgentConfig, default_config
from agent.errors import ConfigError
from agent.sources.registry import describe_kinds

KeyPath = tuple[str | int, ...]

_SUBSTITUTION = re.compile(
    r"\$\$\{"  # escaped: literal ${
    r"|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}"
    r"|\$\{(?P<bad>[^}]*)\}?"
)
_TOML_POSITION = re.compile(r"^(?P<msg>.*) \(at (?P<where>line \d+, column \d+|end of document)\)$")
_TOML_TYPES = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "float",
    dict: "table",
    list: "array",
}


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> AgentConfig:
    """Read, substitute and validate a TOML config file.

    Args:
        path: The TOML file.
        env: Variables for ``${VAR}`` substitution; ``None`` = ``os.environ``.

    Returns:
        The validated config, paths as written (see :meth:`AgentConfig.resolved`).

    Raises:
        ConfigError: The file cannot be read, is not TOML, or does not validate; ``problems``
            holds every problem, one ``key.path: message`` string each.
    """
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(
            "cannot read configuration", [f"cannot read file: {exc.strerror or exc}"], path=path
        ) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            "cannot read configuration",
            [f"not UTF-8 text: {exc.reason} at byte {exc.start}"],
            path=path,
        ) from exc
    return parse_config(text, env, source=str(path))


def parse_config(
    text: str, env: Mapping[str, str] | None = None, source: str = "<string>"
) -> AgentConfig:
    """Parse, substitute and validate config text (see :func:`load_config`).

    Args:
        text: TOML document.
        env: Variables for substitution; ``None`` = ``os.environ``.
        source: Where the text came from, for the error's context.

    Returns:
        The validated config.

    Raises:
        ConfigError: With every problem in ``problems``.
    """
    try:
        data = tomllib.loads(text)
        data, problems = substitute_env(data, os.environ if env is None else env)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("invalid configuration", [_toml_problem(exc, text)], path=source) from exc
    except RecursionError as exc:  # tomllib and the substitution recurse into nested values
        raise ConfigError("invalid configuration", [
            "TOML nested too deeply (arrays or inline tables within each other)"],
            path=source) from exc
    bad_keys = {p.split(": ", 1)[0] for p in problems}
    try:
        config = AgentConfig.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            key, message = format_error(err)
            if key not in bad_keys:  # a failed substitution explains that key already
                problems.append(f"{key}: {message}")
        raise ConfigError("invalid configuration", problems, path=source) from exc
    if problems:
        raise ConfigError("invalid configuration", problems, path=source)
    return config


def substitute_env(
    data: dict[str, Any], env: Mapping[str, str]
) -> tuple[dict[str, Any], list[str]]:
    """Substitute ``${VAR}`` / ``${VAR:-default}`` in every string value of a TOML document.

    Args:
        data: The parsed document (not modified).
        env: Variable values.

    Returns:
        The substituted copy, and a ``key.path: message`` problem per failed substitution
        (the value is then left as written).
    """
    problems: list[str] = []

    def walk(value: Any, path: KeyPath) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, (*path, i)) for i, v in enumerate(value)]
        if isinstance(value, str) and "${" in value:
            return _substitute(value, env, format_key_path(path), problems)
        return value

    return walk(data, ()), problems


def _substitute(text: str, env: Mapping[str, str], key: str, problems: list[str]) -> str:
    """Substitute one string; append a problem and return ``text`` unchanged on failure."""
    failed: list[str] = []

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        if match.group("bad") is not None:
            failed.append(
                f"invalid substitution '{match.group(0)}': use ${{VAR}} or ${{VAR:-default}}"
            )
            return match.group(0)
        name, default = match.group("name"), match.group("default")
        value = env.get(name)
        if default is not None and not value:
            return default
        if value is None:
            failed.append(f"environment variable {name} is not set (and no ${{{name}:-default}})")
            return match.group(0)
        return value

    result = _SUBSTITUTION.sub(replace, text)
    problems.extend(f"{key}: {message}" for message in failed)
    return text if failed else result


def format_error(err: ErrorDetails) -> tuple[str, str]:
    """Turn one pydantic error into ``(key.path, message)`` in the config file's terms.

    The discriminator tag pydantic inserts into a union's location (``source.serial.port``) is
    dropped; ``extra_forbidden`` reads ``unknown key`` (with a close known key, if any); type
    errors name the TOML type that was given.
    """
    path, parent = _walk_schema(tuple(err["loc"]))
    kind, message = err["type"], err["msg"]
    if kind == "extra_forbidden":
        message = "unknown key"
        if parent is not None and path and isinstance(path[-1], str):
            close = difflib.get_close_matches(path[-1], list(parent.model_fields), n=1)
            if close:
                message += f" (did you mean '{close[0]}'?)"
    elif kind == "missing":
        message = "required key is missing"
    elif kind == "union_tag_not_found":
        message = "'kind' is missing: " + _expected_tags(parent, path)
    elif kind == "value_error":
        message = message.removeprefix("Value error, ")
    elif kind.endswith("_type") and type(err["input"]) in _TOML_TYPES:
        message += f" (got {_TOML_TYPES[type(err['input'])]})"
    return format_key_path(path), message


def _expected_tags(parent: type[BaseModel] | None, path: KeyPath) -> str:
    """``one of 'replay', 'serial', 'simulator'`` for the union field at ``path``."""
    field = parent.model_fields.get(str(path[-1])) if parent is not None and path else None
    members = _model_union_members(field.annotation) if field is not None else []
    tags = ", ".join(repr(_tag_of(m)) for m in members)
    return f"one of {tags}" if tags else "it selects the kind of this table"


def format_key_path(path: KeyPath) -> str:
    """``("streams", 0, "source", "port")`` -> ``streams[0].source.port``; ``()`` -> ``<root>``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "<root>"


def _walk_schema(loc: KeyPath) -> tuple[KeyPath, type[BaseModel] | None]:
    """Follow ``loc`` through the schema; drop union tags; return the model owning the last key."""
    tp: Any = AgentConfig
    parent: type[BaseModel] | None = None
    path: list[str | int] = []
    for part in loc:
        tp = _strip_optional(tp)
        if isinstance(part, int):
            path.append(part)
            args = get_args(tp) if get_origin(tp) is list else ()
            tp = args[0] if args else None
            continue
        members = _model_union_members(tp)
        tagged = [m for m in members if _tag_of(m) == part]
        if tagged:  # pydantic's discriminator tag, not a key of the file
            tp = tagged[0]
            continue
        path.append(part)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            parent = tp
            field = tp.model_fields.get(part)
            tp = field.annotation if field is not None else None
        else:
            parent, tp = None, None
    return tuple(path), parent


def _strip_optional(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _model_union_members(tp: Any) -> list[type[BaseModel]]:
    if get_origin(tp) in (Union, types.UnionType):
        return [a for a in get_args(tp) if isinstance(a, type) and issubclass(a, BaseModel)]
    return []


def _tag_of(model: type[BaseModel]) -> object:
    field = model.model_fields.get("kind")
    return field.default if field is not None else None


def _toml_problem(exc: tomllib.TOMLDecodeError, text: str) -> str:
    match = _TOML_POSITION.match(str(exc))
    if match is None:
        return f"TOML syntax error: {exc}"
    where = match["where"]
    if where == "end of document":
        lines = text.split("\n")
        where = f"line {len(lines)}, column {len(lines[-1]) + 1} (end of document)"
    return f"TOML syntax error at {where}: {match['msg']}"


# ---------------------------------------------------------------------------------------------
# Default config as commented TOML, generated from the schema


def dump_default_config() -> str:
    """The embedded default config as commented TOML (runs as-is: one simulator stream).

    Returns:
        A TOML document in which every key is preceded by ``# <its description>``; keys without
        a value (``None``) are written commented out.
    """
    return dump_config(default_config())


def dump_config(config: AgentConfig) -> str:
    """Write ``config`` as commented TOML; :func:`parse_config` of the result equals it.

    Args:
        config: Any valid config.

    Returns:
        The TOML text, descriptions taken from the schema.
    """
    lines = [
        "# edge-agent configuration (written by `edge-agent print-default-config`).",
        "# Relative paths are relative to this file's directory; store.path is relative to",
        "# agent.state_dir. String values may use ${VAR} and ${VAR:-default} (environment).",
        "# Check a file with `edge-agent check-config FILE`.",
        "# Installed source kinds ([streams.source] kind = ...; docs/sources.md):",
        *(f"#   {line}" for line in describe_kinds()),
    ]
    _dump_table(lines, config, header=None, array=False)
    return "\n".join(lines) + "\n"


def _dump_table(lines: list[str], model: BaseModel, header: str | None, array: bool) -> None:
    if header is not None:
        lines.append(f"[[{header}]]" if array else f"[{header}]")
    nested: list[tuple[str, str | None, BaseModel, bool]] = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            nested.append((name, field.description, value, False))
            continue
        if isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
            nested.extend((name, field.description, item, True) for item in value)
            continue
        lines.extend(_comment(field.description))
        if value is None:
            example = field.examples[0] if field.examples else None
            lines.append("# " + (_toml_line(name, example) if example is not None else f"{name} ="))
        else:
            lines.append(_toml_line(name, value))
    for name, description, value, is_array in nested:
        key = tomli_w.dumps({name: 0}).split(" = ")[0]
        lines.append("")
        lines.extend(_comment(description))
        _dump_table(lines, value, f"{header}.{key}" if header else key, is_array)


def _toml_line(key: str, value: object) -> str:
    """One ``key = value`` line formatted by tomli_w (quoting, escapes, floats)."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    return tomli_w.dumps({key: value}).rstrip("\n")


def _comment(text: str | None) -> list[str]:
    return ["# " + line for line in textwrap.wrap(text or "", width=96)]
