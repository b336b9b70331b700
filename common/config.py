"""Typed configuration: dataclasses, TOML presets, ``--set key=value`` overrides, ``--dump-config``.

A config is a tree of dataclasses. Presets are TOML files whose tables mirror that tree. Loading
is strict: an unknown key or a value of the wrong type is a :class:`ConfigError` that names the
dotted key and says what is allowed. A dataclass may define ``validate(self)`` for cross-field
checks; it runs after every load.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import tomli_w

from .errors import ConfigError

T = TypeVar("T")


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin in (tuple, list):
        args = get_args(tp)
        inner = _type_name(args[0]) if args else "any"
        return f"list of {inner}"
    if tp is type(None):
        return "none"
    return getattr(tp, "__name__", str(tp))


#: the integers a config value may hold (64-bit signed)
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Check ``value`` against the annotation ``tp``; return it converted (e.g. list -> tuple)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(
                f"config key '{key}': {value!r} is not allowed; expected one of "
                + ", ".join(repr(c) for c in choices)
            )
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None or value == "none":
            if type(None) in args:
                return None
        errors: list[ConfigError] = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(key, arg, value)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1 and value is not None:  # one type besides none: its own, more precise message
            raise errors[0]
        raise ConfigError(f"config key '{key}': expected {_type_name(tp)}, got {value!r}")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}': expected {_type_name(tp)}, got {value!r}")
        args = [a for a in get_args(tp) if a is not Ellipsis]
        inner = args[0] if args else Any
        items = [_coerce(f"{key}[{i}]", inner, v) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key '{key}': expected a table of settings, got {value!r}")
        obj = tp()
        apply_mapping(obj, value, prefix=key + ".")
        return obj
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{key}': expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        else:
            raise ConfigError(f"config key '{key}': expected an integer, got {value!r}")
        if not INT_MIN <= number <= INT_MAX:  # torch, numpy and the logs hold 64-bit integers
            raise ConfigError(f"config key '{key}': {number} does not fit a 64-bit integer")
        return number
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer beyond the float range
                raise ConfigError(f"config key '{key}': {value} is beyond the float range") from None
            if not math.isfinite(number):
                raise ConfigError(f"config key '{key}': expected a finite number, got {value!r}")
            return number
        raise ConfigError(f"config key '{key}': expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise ConfigError(f"config key '{key}': expected a path, got {value!r}")
    raise ConfigError(f"config key '{key}': unsupported type {tp!r}")  # a bug in a config class


def _hints(obj_or_cls: Any) -> dict[str, Any]:
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    return typing.get_type_hints(cls)


def _field_names(obj: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(obj)]


def _unknown_key(prefix: str, name: str, allowed: Sequence[str]) -> ConfigError:
    section = prefix.rstrip(".") or "the top level"
    hint = difflib.get_close_matches(name, allowed, n=1)
    did_you_mean = f" (did you mean '{prefix}{hint[0]}'?)" if hint else ""
    return ConfigError(
        f"unknown config key '{prefix}{name}'{did_you_mean}; allowed keys in {section}: "
        + ", ".join(allowed)
    )


def apply_mapping(obj: Any, mapping: Mapping[str, Any], prefix: str = "") -> None:
    """Set fields of dataclass ``obj`` from a nested mapping, strictly."""
    names = _field_names(obj)
    hints = _hints(obj)
    for name, value in mapping.items():
        if name not in names:
            raise _unknown_key(prefix, name, names)
        tp = hints[name]
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current) and isinstance(value, Mapping):
            apply_mapping(current, value, prefix=f"{prefix}{name}.")
        else:
            setattr(obj, name, _coerce(prefix + name, tp, value))


def _parse_literal(text: str) -> Any:
    """Parse the right-hand side of ``--set key=value`` as a TOML value, else as a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def set_override(obj: Any, assignment: str) -> None:
    """Apply one ``dotted.key=value`` override to the config tree ``obj``."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r}: expected KEY=VALUE, e.g. train.seed=7")
    dotted, text = assignment.split("=", 1)
    dotted = dotted.strip()
    parts = dotted.split(".")
    target = obj
    prefix = ""
    for part in parts[:-1]:
        names = _field_names(target)
        if part not in names or not dataclasses.is_dataclass(getattr(target, part)):
            sections = [n for n in names if dataclasses.is_dataclass(getattr(target, n))]
            if part not in names:
                raise _unknown_key(prefix, part, names)
            raise ConfigError(
                f"config key '{prefix}{part}' is a value, not a section; sections: "
                + ", ".join(sections)
            )
        target = getattr(target, part)
        prefix += part + "."
    apply_mapping(target, {parts[-1]: _coerce_text(target, parts[-1], prefix, text)}, prefix)


def _coerce_text(target: Any, name: str, prefix: str, text: str) -> Any:
    names = _field_names(target)
    if name not in names:
        raise _unknown_key(prefix, name, names)
    value = _parse_literal(text)
    tp = _hints(target)[name]
    # a bare word for a string-typed key ('--set data.root=/x') stays a string
    if isinstance(value, (int, float, bool)) and _accepts_str_only(tp):
        value = text
    return value


def _accepts_str_only(tp: Any) -> bool:
    if tp in (str, Path):
        return True
    if get_origin(tp) in (typing.Union, types.UnionType):
        return any(_accepts_str_only(a) for a in get_args(tp)) and not any(
            a in (int, float, bool) for a in get_args(tp)
        )
    return False


def validate(obj: Any) -> None:
    """Run ``validate()`` on every dataclass in the tree, children first."""
    for name in _field_names(obj):
        child = getattr(obj, name)
        if dataclasses.is_dataclass(child):
            validate(child)
    check = getattr(obj, "validate", None)
    if callable(check):
        check()


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def resolve_preset(source: str | Path, presets_dir: Path | None) -> Path:
    """``mini`` -> ``<presets_dir>/mini.toml``; anything with a suffix or a slash is a path."""
    text = str(source)
    if presets_dir is not None and "/" not in text and not text.endswith(".toml"):
        path = presets_dir / f"{text}.toml"
        if not path.exists():
            names = sorted(p.stem for p in presets_dir.glob("*.toml"))
            raise ConfigError(
                f"no preset named '{text}' in {presets_dir}; presets: {', '.join(names) or 'none'}"
            )
        return path
    return Path(text)


def load_config(
    cls: type[T],
    source: str | Path | None = None,
    overrides: Sequence[str] = (),
    presets_dir: Path | None = None,
) -> T:
    """Defaults of ``cls`` <- preset/TOML file ``source`` <- ``overrides``; then validate."""
    obj = cls()
    if source is not None:
        path = resolve_preset(source, presets_dir)
        try:
            apply_mapping(obj, read_toml(path))
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    for assignment in overrides:
        set_override(obj, assignment)
    validate(obj)
    return obj


def to_dict(obj: Any) -> dict[str, Any]:
    """The config tree as plain TOML-able values (tuples -> lists, paths -> strings, None dropped)."""
    out: dict[str, Any] = {}
    for name in _field_names(obj):
        value = getattr(obj, name)
        if dataclasses.is_dataclass(value):
            out[name] = to_dict(value)
        elif value is None:
            continue
        elif isinstance(value, (tuple, list)):
            out[name] = [str(v) if isinstance(v, Path) else v for v in value]
        elif isinstance(value, Path):
            out[name] = str(value)
        else:
            out[name] = value
    return out


def flatten(obj: Any) -> dict[str, Any]:
    """``{'optim.lr': 0.1, ...}`` for logging and reporting."""
    return flatten_dict(to_dict(obj))


def flatten_dict(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, Mapping):
            flat.update(flatten_dict(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def dumps_toml(obj: Any) -> str:
    return tomli_w.dumps(to_dict(obj))
