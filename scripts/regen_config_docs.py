"""Rewrite the generated views of verl-tlt's config dataclasses: `python scripts/regen_config_docs.py`.

Run it after adding or changing a knob. It rewrites only what is generated from the dataclasses, and leaves every
other line of those files alone:

- the `tlt:` block (from its class comment to the next top-level key) in the three Hydra YAML files, rendered from
  `verl_tlt.config.TLTConfig` in verl's style (a comment above every key, a blank line between keys);
- the key tables in docs/config_reference.md between their `<!-- BEGIN GENERATED ... -->` and
  `<!-- END GENERATED ... -->` markers: the `tlt` block, and the torch rollout's `engine_kwargs.torch`
  (`TorchRolloutConfig`).

tests/test_config.py loads this file as a module and fails when a file differs from what it renders.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_tlt.config import ROOT_KEY, TLTConfig
from verl_tlt.integrations.torch_rollout.options import TORCH_ENGINE_KWARGS_KEY, TorchRolloutConfig
from verl_tlt.strict_config import field_default, format_value, is_config_group, type_name

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "verl_tlt" / "hydra_conf"
# Each YAML file holding the tlt block, with the keys whose value differs from the default there.
YAML_FILES: dict[Path, dict[str, Any]] = {
    CONF / "tlt_ppo_trainer.yaml": {},
    CONF / "tlt" / "off.yaml": {},
    CONF / "tlt" / "on.yaml": {"enabled": True},
}
DOCS = ROOT / "docs" / "config_reference.md"
# Marker name -> (dataclass, key prefix) of each generated table in DOCS.
DOCS_TABLES: dict[str, tuple[type, str]] = {
    "TLTConfig": (TLTConfig, f"{ROOT_KEY}."),
    "TorchRolloutConfig": (TorchRolloutConfig, f"{TORCH_ENGINE_KWARGS_KEY}."),
}
TABLE_HEADER = "| key | type | default | meaning |\n| --- | --- | --- | --- |"


# ---------------------------------------------------------------- field introspection


@dataclass(frozen=True)
class FieldSpec:
    """One leaf key of a config dataclass, flattened: what the YAML files and the docs tables list."""

    key: str  # dotted path below the root, e.g. "enabled" or "drafter.lr"
    type_name: str  # e.g. "bool", "int | None"
    default: Any
    help: str


def iter_fields(cls: type = TLTConfig, prefix: str = "") -> Iterator[FieldSpec]:
    """Every leaf field of ``cls`` (recursing into nested groups), in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, tp = f"{prefix}{f.name}", hints[f.name]
        if is_config_group(tp):
            yield from iter_fields(tp, prefix=f"{key}.")
        else:
            yield FieldSpec(key=key, type_name=type_name(tp), default=field_default(f), help=help_of(f, cls))


def help_of(f: dataclasses.Field, owner: type) -> str:
    """A field's ``metadata["help"]`` on one line; every field needs one (it is its YAML comment and docs row)."""
    text = f.metadata.get("help")
    if not text:
        raise TypeError(f"{owner.__name__}.{f.name} has no metadata['help']; the YAML and docs need one")
    return " ".join(text.split())


def class_comment(cls: type) -> str:
    """First docstring line: the comment above the root block's key."""
    return (cls.__doc__ or cls.__name__).strip().splitlines()[0]


# ---------------------------------------------------------------- YAML


def render_yaml_block(
    overrides: Mapping[str, Any] | None = None, cls: type = TLTConfig, indent: int = 0, root: str = ROOT_KEY
) -> str:
    """The ``tlt:`` block in verl's YAML style: a comment above every key, a blank line between keys.

    ``overrides`` maps dotted keys (``"enabled"``) to values that replace the defaults (``tlt/on.yaml``).
    """
    overrides = dict(overrides or {})
    unknown = set(overrides) - {spec.key for spec in iter_fields(cls)}
    if unknown:
        raise ValueError(f"render_yaml_block: unknown override keys {sorted(unknown)}")
    pad = " " * indent
    lines = [f"{pad}# {class_comment(cls)}", f"{pad}{root}:"]
    lines += _render_fields(cls, overrides, indent + 2, prefix="")
    return "\n".join(lines) + "\n"


def _render_fields(cls: type, overrides: Mapping[str, Any], indent: int, prefix: str) -> list[str]:
    pad = " " * indent
    hints = typing.get_type_hints(cls)
    lines: list[str] = []
    for f in dataclasses.fields(cls):
        key, tp = f"{prefix}{f.name}", hints[f.name]
        lines += ["", f"{pad}# {help_of(f, cls)}"]
        if is_config_group(tp):
            lines.append(f"{pad}{f.name}:")
            lines += _render_fields(tp, overrides, indent + 2, prefix=f"{key}.")
        else:
            lines.append(f"{pad}{f.name}: {format_value(overrides.get(key, field_default(f)))}")
    return lines


def replace_yaml_block(text: str, block: str, root: str = ROOT_KEY) -> str:
    """``text`` with its top-level ``root:`` block (and the one comment line above it) replaced by ``block``.

    The block ends before the next line that is neither blank nor indented (the next top-level comment or key), or
    at the end of the file; the blank lines before that stay.
    """
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if line == f"{root}:"]
    if len(starts) != 1:
        raise ValueError(f"expected one top-level '{root}:' line, found {len(starts)}")
    begin = starts[0] - 1 if starts[0] > 0 and lines[starts[0] - 1].startswith("#") else starts[0]
    end = starts[0] + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][0].isspace()):
        end += 1
    while end > starts[0] + 1 and not lines[end - 1].strip():
        end -= 1
    return "\n".join([*lines[:begin], *block.rstrip("\n").split("\n"), *lines[end:]])


# ---------------------------------------------------------------- docs tables


def render_docs_table(cls: type, prefix: str) -> str:
    """The markdown key table of ``cls``: header, then one row per leaf key (``prefix`` + its dotted path)."""
    rows = []
    for spec in iter_fields(cls):
        cells = [f"`{prefix}{spec.key}`", f"`{spec.type_name}`", f"`{format_value(spec.default)}`", spec.help]
        # A bare | would end the cell, even inside backticks (GitHub tables).
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join([TABLE_HEADER, *rows])


def table_markers(name: str) -> tuple[str, str]:
    return (
        f"<!-- BEGIN GENERATED {name} (scripts/regen_config_docs.py; do not edit by hand) -->",
        f"<!-- END GENERATED {name} -->",
    )


def generated_section(text: str, name: str) -> str:
    """What lies between the marker lines of table ``name``."""
    start, stop = _section_bounds(text, name)
    return text[start:stop].strip("\n")


def replace_generated_section(text: str, name: str, body: str) -> str:
    """``text`` with the section of table ``name`` replaced by ``body``; everything outside the markers kept."""
    start, stop = _section_bounds(text, name)
    return f"{text[:start]}\n{body}\n{text[stop:]}"


def _section_bounds(text: str, name: str) -> tuple[int, int]:
    begin, end = table_markers(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(end) < text.index(begin):
        raise ValueError(f"expected one '{begin}' line, then one '{end}' line")
    return text.index(begin) + len(begin), text.index(end)


# ---------------------------------------------------------------- main


def regenerate(yaml_files: Mapping[Path, Mapping[str, Any]] = YAML_FILES, docs: Path = DOCS) -> list[Path]:
    """Rewrite the generated parts of ``yaml_files`` and ``docs``; the files whose text changed."""
    changed = []
    for path, overrides in yaml_files.items():
        if _rewrite(path, lambda text, o=overrides: replace_yaml_block(text, render_yaml_block(o))):
            changed.append(path)
    if _rewrite(docs, render_docs_sections):
        changed.append(docs)
    return changed


def render_docs_sections(text: str) -> str:
    """``text`` (docs/config_reference.md) with every generated table rendered afresh."""
    for name, (cls, prefix) in DOCS_TABLES.items():
        text = replace_generated_section(text, name, render_docs_table(cls, prefix))
    return text


def _rewrite(path: Path, edit: typing.Callable[[str], str]) -> bool:
    text = path.read_text()
    new = edit(text)
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":
    changed = regenerate()
    print("regenerated:", ", ".join(str(p.relative_to(ROOT)) for p in changed) if changed else "nothing changed")
