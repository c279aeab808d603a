"""Habits that keep the package small and one-way: size limits, checked on every run."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "layerwise"
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 80
# An exception to the limits, if one is ever needed: "module.py:function": its size, with the reason
# beside it. The test fails when one grows, and when one fits the limits (take it off the list then).
# Nothing is over the limits today.
OVER_THE_LIMIT: dict[str, int] = {}


def _sizes() -> dict[str, tuple[int, int]]:
    """``{"module.py": (lines, limit), "module.py:function": (lines, limit), "module.py:Class": ...}``."""
    sizes = {}
    for path in sorted(SRC.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        name = str(path.relative_to(SRC))
        sizes[name] = (source.count("\n"), MAX_MODULE_LINES)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                key = f"{name}:{node.name}"
                sizes[key] = max((size, limit), sizes.get(key, (0, limit)))
    return sizes


def test_no_module_class_or_function_is_too_large():
    sizes = _sizes()
    too_long = [
        f"{key}: {size} lines > {OVER_THE_LIMIT.get(key, limit)}"
        for key, (size, limit) in sizes.items()
        if size > max(limit, OVER_THE_LIMIT.get(key, 0))
    ]
    assert not too_long, "split these by concept:\n" + "\n".join(too_long)
    fitting = [key for key in OVER_THE_LIMIT if key not in sizes or sizes[key][0] <= sizes[key][1]]
    assert not fitting, f"these fit the limits now: take them off OVER_THE_LIMIT: {fitting}"


def test_package_ships_type_information():
    assert (SRC / "py.typed").is_file()


def _sibling_imports(package: Path) -> dict[str, set[str]]:
    """Each module of ``package`` and the sibling modules it imports, type-only imports included
    (import-linter's contract leaves those out: a circle through them is still a circle to read)."""
    names = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        if path.stem == "__init__":
            continue
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module is None:
                    found |= {a.name for a in node.names if a.name in names}
                else:
                    found.add(node.module.split(".")[0])
        graph[path.stem] = found & (names - {path.stem})
    return graph


def test_no_two_sibling_modules_import_each_other_not_even_for_types():
    circles = []
    for package in [SRC, *(p for p in SRC.rglob("*") if (p / "__init__.py").is_file())]:
        graph = _sibling_imports(package)

        def reaches(start: str, goal: str, seen: set[str], graph=graph) -> bool:
            return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start])

        circles += [f"{package.name}/{m}.py" for m in sorted(graph) if reaches(m, m, {m})]
    assert not circles, f"modules in an import circle (type-only imports count): {circles}"
