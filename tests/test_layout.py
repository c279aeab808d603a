"""Habits that keep the package small and one-way: size limits, checked on every run."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "layerwise"
MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 250


def test_no_module_or_class_is_too_large():
    too_long = []
    for path in sorted(SRC.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        n_lines = source.count("\n")
        if n_lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(SRC)}: {n_lines} lines > {MAX_MODULE_LINES}")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    too_long.append(
                        f"{path.relative_to(SRC)}: class {node.name} has {size} lines > {MAX_CLASS_LINES}"
                    )
    assert not too_long, "split these by concept:\n" + "\n".join(too_long)


def test_package_ships_type_information():
    assert (SRC / "py.typed").is_file()
