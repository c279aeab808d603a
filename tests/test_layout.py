"""Habits that keep the package small and one-way: size limits, checked on every run."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "layerwise"
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 80
# An exception to the limits, if one is ever needed: "module.py:function": its size, with the reason
# beside it. The test fails when one grows, and when one fits the limits (take it off the list then).
# Nothing is over the limits today.
OVER_THE_LIMIT: dict[str, int] = {}


FMT_SKIP = re.compile(r"[ \t]*# fmt: skip\b")
MAX_FMT_SKIPS = 20  # kept only where alignment reads better: a table of values, with a comment saying so


@pytest.fixture(scope="module")
def formatted(tmp_path_factory) -> Path:
    """The package as ``ruff format`` writes it with the project's settings and every ``# fmt: skip``
    left out: the code the size rules measure (a line packed to fit a count is counted unpacked)."""
    root = tmp_path_factory.mktemp("formatted")
    shutil.copytree(SRC, root / "layerwise", ignore=shutil.ignore_patterns("__pycache__", "static", "data"))
    for path in (root / "layerwise").rglob("*.py"):
        path.write_text(FMT_SKIP.sub("", path.read_text(encoding="utf-8")), encoding="utf-8")
    config = SRC.parents[1] / "pyproject.toml"
    command = [sys.executable, "-m", "ruff", "format", "-q", "--config", str(config), str(root)]
    subprocess.run(command, check=True, capture_output=True)
    return root / "layerwise"


def _sizes(package: Path) -> dict[str, tuple[int, int]]:
    """``{"module.py": (lines, limit), "module.py:function": (lines, limit), "module.py:Class": ...}``."""
    sizes = {}
    for path in sorted(package.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        name = str(path.relative_to(package))
        sizes[name] = (source.count("\n"), MAX_MODULE_LINES)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                key = f"{name}:{node.name}"
                sizes[key] = max((size, limit), sizes.get(key, (0, limit)))
    return sizes


def test_no_module_class_or_function_is_too_large(formatted):
    sizes = _sizes(formatted)
    too_long = [
        f"{key}: {size} lines > {OVER_THE_LIMIT.get(key, limit)}"
        for key, (size, limit) in sizes.items()
        if size > max(limit, OVER_THE_LIMIT.get(key, 0))
    ]
    assert not too_long, "split these by concept (measured as ruff format writes them):\n" + "\n".join(
        too_long
    )
    fitting = [key for key in OVER_THE_LIMIT if key not in sizes or sizes[key][0] <= sizes[key][1]]
    assert not fitting, f"these fit the limits now: take them off OVER_THE_LIMIT: {fitting}"


def test_the_sizes_are_measured_on_formatted_code(formatted):
    """A function packed onto fewer lines with ``# fmt: skip`` is measured as the formatter writes it."""
    packed = "def f(a, b):  # fmt: skip\n    return [a, b, a, b]  # fmt: skip\n"
    probe = formatted / "_probe_sizes.py"
    probe.write_text(
        FMT_SKIP.sub("", "def f(\n    a, b\n):\n    return [a, b]  # fmt: skip\n"), encoding="utf-8"
    )
    config = SRC.parents[1] / "pyproject.toml"
    subprocess.run(
        [sys.executable, "-m", "ruff", "format", "-q", "--config", str(config), str(probe)], check=True
    )
    assert probe.read_text(encoding="utf-8") == "def f(a, b):\n    return [a, b]\n"
    probe.unlink()
    assert FMT_SKIP.sub("", packed) == "def f(a, b):\n    return [a, b, a, b]\n"


def test_fmt_skip_is_kept_for_tables_only():
    """Fewer than MAX_FMT_SKIPS ``# fmt: skip`` markers, each on a table of values that a comment just
    above it says is one (aligned columns read better than the formatter's layout)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for k, line in enumerate(lines):
            if FMT_SKIP.search(line):
                above = " ".join(lines[max(0, k - 12) : k])
                found.append((f"{path.relative_to(SRC)}:{k + 1}", "table" in above.lower()))
    assert len(found) < MAX_FMT_SKIPS, f"{len(found)} '# fmt: skip' markers: {[f for f, _ in found]}"
    unexplained = [where for where, table in found if not table]
    assert not unexplained, (
        f"'# fmt: skip' without a comment naming the table it keeps aligned: {unexplained}"
    )


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


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(dotted: str) -> bool:
    return (SRC.parent / dotted.replace(".", "/") / "__init__.py").is_file()


def _is_module(dotted: str) -> bool:
    where = SRC.parent / dotted.replace(".", "/")
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def _imports_from(path: Path) -> list[tuple[str, list[str]]]:
    """``(module imported from, names)`` of every ``from … import`` of layerwise in ``path``, at any
    depth (inside functions and ``if TYPE_CHECKING`` too), relative ones resolved."""
    here = _module_name(path)
    package = here if path.stem == "__init__" else here.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = f"{base}.{node.module}" if node.module else base
        elif node.module and (node.module == "layerwise" or node.module.startswith("layerwise.")):
            target = node.module
        else:
            continue
        found.append((target, [a.name for a in node.names]))
    return found


def test_no_module_imports_from_a_package_init_above_it():
    """A name taken from the ``__init__`` of a package the importer sits in runs back up the house
    (``from .. import __version__`` made ``layerwise/__init__.py`` a floor of the data path); a
    package's modules import from the modules that define things (``_version.py``)."""
    upward = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "__main__.py":  # ``python -m``'s entry runs its package: not a floor of it
            continue
        here = _module_name(path)
        for target, names in _imports_from(path):
            if not _is_package(target) or not (here.startswith(target + ".") or here == target):
                continue
            upward += [f"{path.relative_to(SRC)}: from {target} import {n}" for n in names
                       if not _is_module(f"{target}.{n}")]  # fmt: skip
    assert not upward, "names imported from a package's __init__ above the importer:\n" + "\n".join(upward)


def test_no_circle_runs_through_a_package_init():
    """The sibling test with each ``__init__`` as a node of its package: a child that takes a name
    from ``__init__`` while ``__init__`` imports the child is a circle too (ray's actors once were)."""
    circles = []
    for package in [SRC, *(p for p in SRC.rglob("*") if (p / "__init__.py").is_file())]:
        name = _module_name(package / "__init__.py")
        graph: dict[str, set[str]] = {}
        for path in package.glob("*.py"):
            edges = set()
            for target, names in _imports_from(path):
                if target == name:
                    edges |= {n if _is_module(f"{name}.{n}") else "__init__" for n in names}
                elif target.startswith(name + "."):
                    edges.add(target[len(name) + 1 :].split(".")[0])
            graph[path.stem] = edges - {path.stem}
        graph = {m: {n for n in e if n in graph} for m, e in graph.items()}

        def reaches(start: str, goal: str, seen: set[str], graph=graph) -> bool:
            return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start])

        circles += [f"{package.name}/{m}.py" for m in sorted(graph) if reaches(m, m, {m})]
    assert not circles, f"modules in an import circle through their package's __init__: {circles}"


def test_no_private_name_crosses_a_module():
    """A name with a leading underscore belongs to its module; what another module needs is public
    inside the package (``cli/_shared.py``' ``fail``, not ``_fail``). Private modules may be
    imported: their names say they are not the public API."""
    crossing = []
    for path in sorted(SRC.rglob("*.py")):
        for target, names in _imports_from(path):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            crossing += [f"{path.relative_to(SRC)}: from {target} import {n}" for n in private
                         if not _is_module(f"{target}.{n}")]  # fmt: skip
    assert not crossing, "private names imported from another module:\n" + "\n".join(crossing)


# files of other projects that docstrings cite (where a convention comes from)
ELSEWHERE = {"run_squad.py", "utils/output_capturing.py", "modeling_bert.py", "create_pretraining_data.py"}
REPO = SRC.parents[1]


def _docstrings(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield text


def test_docstrings_name_modules_that_exist():
    """Every ``….py`` a docstring names is a file of this repository (a path's tail: ``_inputs/block.py``,
    ``tests/test_parity.py``), and every ``layerwise.a.b`` resolves to a module, then a name that module
    holds: a module renamed or moved cannot leave its old name in the prose."""
    files = [p.relative_to(REPO).as_posix() for d in ("src", "tests", "benchmarks", "scripts")
             for p in (REPO / d).rglob("*.py")]  # fmt: skip
    stale = []
    for path in sorted(SRC.rglob("*.py")):
        for text in _docstrings(path):
            for ref in re.findall(r"[\w./]*\w\.py\b", text):
                tail = ref.lstrip("./")
                if tail not in ELSEWHERE and not any(f == tail or f.endswith("/" + tail) for f in files):
                    stale.append(f"{path.relative_to(SRC)}: {ref}")
            for dotted in re.findall(r"\blayerwise(?:\.\w+)+", text):
                parts = dotted.split(".")
                k = max(k for k in range(1, len(parts) + 1) if _is_module(".".join(parts[:k])))
                if k == len(parts):
                    continue
                module = REPO / "src" / Path(*parts[:k])
                source = (module.with_suffix(".py") if module.with_suffix(".py").is_file()
                          else module / "__init__.py").read_text(encoding="utf-8")  # fmt: skip
                if not re.search(rf"\b{re.escape(parts[k])}\b", source):  # defined or re-exported there
                    stale.append(f"{path.relative_to(SRC)}: {dotted}")
    assert not stale, "docstrings naming modules or names that do not exist:\n" + "\n".join(stale)


def test_the_layout_in_the_docs_names_every_module():
    """docs/internals.md's layout lists every module under its package's line (a package's
    ``__init__.py`` aside), and a sub-package's modules under its own ``name/`` line inside its
    package's, so a new module is placed and described where a reader looks."""
    block = (REPO / "docs" / "internals.md").read_text(encoding="utf-8").split("## Layout", 1)[1]
    block = block.split("```text", 1)[1].split("```", 1)[0]
    sections: dict[str, str] = {}
    current = ""
    for line in block.splitlines():
        heading = re.match(r"^  (\S+)", line)
        if heading:  # "  _model/  handle.py (…)" opens a package's lines; "  _results.py …" a top-level one
            top = heading.group(1).rstrip("/") if heading.group(1).endswith("/") else ""
            current = top
        nested = re.match(r"^ {18}(\w+)/(?:\s|$)", line)  # "  loading/  source.py …" inside a package
        if nested and "/" not in current and current:
            current = f"{current}/{nested.group(1)}"
        elif nested and current:
            current = f"{current.split('/')[0]}/{nested.group(1)}"
        sections[current] = sections.get(current, "") + line + "\n"
    unlisted = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        package, _, name = relative.rpartition("/")
        if name == "__init__.py" and package:
            continue
        if not re.search(rf"(?<![\w/]){re.escape(name)}\b", sections.get(package, "")):
            unlisted.append(relative)
    assert not unlisted, f"modules docs/internals.md's layout does not name: {unlisted}"


# the longest chain of module-level imports inside the package (layerwise.store -> … -> _version);
# a refactoring may make it shorter, never longer
MAX_IMPORT_DEPTH = 10


def test_the_module_level_import_graph_has_no_circle_and_is_no_deeper_than_it_was():
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        found = set()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:  # what importing it runs
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                wanted = (f"{target}.{a.name}" for a in node.names)
                found |= {w if w in modules else target for w in wanted}
        graph[name] = found & set(modules) - {name}
    depth: dict[str, int] = {}

    def measure(name: str, path: tuple[str, ...]) -> int:
        assert name not in path, f"import circle: {' -> '.join((*path, name))}"
        if name not in depth:
            depth[name] = 1 + max((measure(d, (*path, name)) for d in graph[name]), default=0)
        return depth[name]

    deepest = max(modules, key=lambda m: measure(m, ()))
    assert depth[deepest] <= MAX_IMPORT_DEPTH, f"{deepest} starts a chain of {depth[deepest]} imports"
