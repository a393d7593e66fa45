"""CONTRIBUTING's size rules hold in the code: files of one job (500 lines at most), functions short enough to read
(80 lines of code at most, docstring and nested definitions aside; about 60 is the aim)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "verl_tlt"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


def function_code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    for child in node.body:
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            lines -= child.end_lineno - child.lineno + 1
    return lines


def test_files_and_functions_stay_within_contributings_sizes():
    too_long = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        source = path.read_text()
        name = path.relative_to(PACKAGE_ROOT.parent)
        if source.count("\n") > MAX_FILE_LINES:
            too_long.append(f"{name}: {source.count(chr(10))} lines (at most {MAX_FILE_LINES})")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = function_code_lines(node)
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}: {lines} lines of code (at most 80)")
    assert not too_long, "split these (CONTRIBUTING, style):\n" + "\n".join(too_long)


def test_the_function_measure_leaves_out_docstrings_and_nested_definitions():
    source = 'def outer():\n    """Doc\n    string."""\n    x = 1\n    def inner():\n        return 2\n    return x\n'
    (node,) = ast.parse(source).body
    assert function_code_lines(node) == 3  # def line, x = 1, return x
