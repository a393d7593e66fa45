"""A strict loader for frozen config dataclasses: plain dicts or OmegaConf nodes in, validated dataclasses out.

Generic: it knows nothing of TLT's keys. Unknown keys and wrong types raise ``ValueError`` naming the full key path,
the value, why, and the override that fixes it, so that a bad command line fails at start-up and every config of
the project (the ``tlt`` block in ``verl_tlt.config``, the torch rollout's options) reads the same way in errors.
Imports nothing heavy (omegaconf lazily, and only when handed an OmegaConf node).
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

# ---------------------------------------------------------------- names and values in messages


def type_name(tp: Any) -> str:
    """Readable name of a field type for messages and docs: ``bool``, ``int | None``, ``'a' | 'b'``."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join("None" if a is type(None) else type_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        args = ", ".join("..." if a is Ellipsis else type_name(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{args}]"
    return getattr(tp, "__name__", str(tp))


def format_value(value: Any) -> str:
    """A value as written in YAML and on the Hydra command line (``true``, ``null``, ``[1, 2]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, str) and not _is_bare_yaml_string(value):
        return json.dumps(value)
    return str(value)


# ---------------------------------------------------------------- loading


def build_config(cls: type, d: Mapping[str, Any] | None, path: str) -> Any:
    """Build the frozen config dataclass ``cls`` from a plain dict or an OmegaConf node found at key ``path``.

    Interpolations are resolved first; ``None`` means all defaults. Unknown keys and wrong types raise
    ``ValueError`` naming the full key path (``path``-rooted), the value, why, and the override that fixes it;
    nested dataclass fields are loaded as groups, recursively. Values are never coerced.
    """
    return _build(cls, to_plain(d, path), path)


def to_plain(d: Any, path: str) -> Any:
    """OmegaConf node -> plain containers with interpolations resolved; anything else unchanged."""
    if type(d).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf  # lazy: keep `import verl_tlt.config` dependency-free

        try:
            return OmegaConf.to_container(d, resolve=True)
        except Exception as e:  # an unresolvable ${...} somewhere in the block
            raise ValueError(
                f"{path}: could not resolve an interpolation in the config block ({e}); fix or remove "
                f"the ${{...}} reference under {path}."
            ) from e
    return d


def _build(cls: type, d: Any, path: str) -> Any:
    if d is None:
        return cls()
    if not isinstance(d, Mapping):
        raise ValueError(
            f"{path} must be a mapping of keys ({_valid_keys(cls)}), got {d!r} ({type(d).__name__}); "
            f"set individual keys instead, e.g. {path}.{_example_override(cls)}."
        )
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in d:
        if key not in names:
            raise ValueError(
                f"Unknown config key '{path}.{key}' (value {d[key]!r}). Valid keys under '{path}': "
                f"{_valid_keys(cls)}. verl-tlt reads only the keys {cls.__name__} declares, so a misspelt key would "
                f"otherwise be silently ignored. Fix: remove the override that sets {path}.{key} (e.g. "
                f"+{path}.{key}=... on the command line) or correct its name, e.g. {path}.{_example_override(cls)} "
                f"(all keys: docs/config_reference.md)."
            )
    kwargs = {}
    for name in names:
        if name not in d:
            continue
        tp, key_path = hints[name], f"{path}.{name}"
        if is_config_group(tp):
            kwargs[name] = _build(tp, to_plain(d[name], key_path), key_path)
        else:
            kwargs[name] = _check_value(tp, d[name], key_path, _field(cls, name))
    return cls(**kwargs)


def _check_value(tp: Any, value: Any, path: str, f: dataclasses.Field) -> Any:
    """Return ``value`` (normalised: tuple for tuple fields, float for int-given floats) or raise."""
    ok, normalised = _matches(tp, value)
    if ok:
        return normalised
    raise ValueError(
        f"{path} must be {type_name(tp)}, got {value!r} ({type(value).__name__}); verl-tlt does not coerce "
        f"config values, so that a typo cannot silently change behaviour. "
        f"Fix: {_fix_hint(tp, path, field_default(f))}."
    )


def _matches(tp: Any, value: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True, value
    if origin is Literal:
        return value in typing.get_args(tp), value
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, normalised = (value is None, value) if arg is type(None) else _matches(arg, value)
            if ok:
                return True, normalised
        return False, value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False, value
        args = [a for a in typing.get_args(tp) if a is not Ellipsis] or [Any]
        items = [_matches(args[0], v) for v in value]
        if not all(ok for ok, _ in items):
            return False, value
        return True, origin(v for _, v in items)
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return is_number, float(value) if is_number else value
    if isinstance(tp, type):
        return isinstance(value, tp), value
    return False, value


def _fix_hint(tp: Any, path: str, default: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is bool:
        return f"set {path}=true or {path}=false"
    if origin is Literal:
        return "set " + " or ".join(f"{path}={format_value(a)}" for a in typing.get_args(tp))
    return f"set {path}=<{type_name(tp)}>, e.g. {path}={format_value(default)} (the default)"


# ---------------------------------------------------------------- helpers


def listify(value: Any) -> Any:
    return [listify(v) for v in value] if isinstance(value, (list, tuple)) else value


def _is_bare_yaml_string(s: str) -> bool:
    """True when ``s`` reads back as the same string unquoted (not a bool, null or number)."""
    return bool(re.fullmatch(r"[A-Za-z_][\w./-]*", s)) and s.lower() not in _YAML_SPECIAL_WORDS


_YAML_SPECIAL_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "none", "y", "n"}


def is_config_group(tp: Any) -> bool:
    """True when a field of type ``tp`` is a nested group of keys (a dataclass), not a leaf value."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _field(cls: type, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def field_default(f: dataclasses.Field) -> Any:
    """A field's default value (its factory's product for groups); every config field must have one."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"config field {f.name!r} has no default; every knob needs one")


def _valid_keys(cls: type) -> str:
    return ", ".join(f.name for f in dataclasses.fields(cls))


def _example_override(cls: type) -> str:
    """``key=default`` of the first leaf field of ``cls`` (descending into groups), for "e.g." hints."""
    first = dataclasses.fields(cls)[0]
    tp = typing.get_type_hints(cls)[first.name]
    if is_config_group(tp):
        return f"{first.name}.{_example_override(tp)}"
    return f"{first.name}={format_value(field_default(first))}"
