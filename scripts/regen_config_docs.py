"""Rewrite the generated views of the `tlt` block from verl_tlt.config.TLTConfig.

Run after adding or changing a knob: `python scripts/regen_config_docs.py`. It replaces the `tlt:` block in the
three Hydra YAML files and the key table in docs/config_reference.md; tests/test_config.py checks both.
"""

from __future__ import annotations

import re
from pathlib import Path

from verl_tlt.config import format_value, iter_fields, render_yaml_block

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "verl_tlt" / "hydra_conf"
YAML_FILES = {
    CONF / "tlt_ppo_trainer.yaml": None,
    CONF / "tlt" / "off.yaml": None,
    CONF / "tlt" / "on.yaml": {"enabled": True},
}
DOCS = ROOT / "docs" / "config_reference.md"
# The block runs from its class comment to the blank line before the next top-level comment.
BLOCK = re.compile(r"^# TLT \(Taming the Long-Tail\).*?\ntlt:\n.*?(?=\n\n# )", re.S | re.M)


def regenerate_yaml(path: Path, overrides: dict | None) -> None:
    text = path.read_text()
    block = render_yaml_block(overrides).rstrip("\n")
    new, count = BLOCK.subn(lambda _: block, text, count=1)
    if count != 1:
        raise SystemExit(f"{path}: no tlt block found")
    path.write_text(new)


def regenerate_docs_table() -> None:
    lines = DOCS.read_text().splitlines()
    header = lines.index("| key | type | default | meaning |")
    end = header + 2
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    rows = [f"| `tlt.{s.key}` | `{s.type_name}` | `{format_value(s.default)}` | {s.help} |" for s in iter_fields()]
    DOCS.write_text("\n".join(lines[: header + 2] + rows + lines[end:]) + "\n")


if __name__ == "__main__":
    for path, overrides in YAML_FILES.items():
        regenerate_yaml(path, overrides)
    regenerate_docs_table()
    print("regenerated", ", ".join(str(p.relative_to(ROOT)) for p in [*YAML_FILES, DOCS]))
