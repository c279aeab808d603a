import subprocess
import sys

import layerwise


def test_all_is_sorted_and_resolves():
    assert layerwise.__all__ == sorted(layerwise.__all__)
    for name in layerwise.__all__:
        assert getattr(layerwise, name) is not None


def test_exports_match_the_type_checking_imports():
    """The lazy export map and the TYPE_CHECKING block must name the same objects, from the same
    modules: a name added to one and forgotten in the other fails here."""
    import ast
    from pathlib import Path

    source = Path(layerwise.__file__).read_text(encoding="utf-8")
    tree = ast.parse(source)
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    for alias in stmt.names:
                        if stmt.module is None:  # from . import ray: the name is the module
                            typed[alias.asname or alias.name] = alias.name
                        elif alias.asname in layerwise._SUBMODULES:  # from .analysis import stats as analyze
                            typed[alias.asname] = f"{stmt.module}.{alias.name}"
                        else:
                            typed[alias.asname or alias.name] = stmt.module
    lazy = {**layerwise._EXPORTS, **layerwise._SUBMODULES}
    assert typed == lazy
    assert set(layerwise.__all__) == set(lazy) | {"__version__"}
    for name, module in layerwise._EXPORTS.items():
        import importlib

        assert getattr(importlib.import_module(f"layerwise.{module}"), name) is getattr(layerwise, name)


def test_unknown_attribute():
    try:
        layerwise.nope  # noqa: B018
    except AttributeError as exc:
        assert "nope" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_import_does_not_load_torch():
    code = "import sys, layerwise; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_errors_keep_builtin_bases():
    assert issubclass(layerwise.LayerSpecError, ValueError)
    assert issubclass(layerwise.ModelLoadError, OSError)
    assert issubclass(layerwise.MissingDependencyError, ImportError)
    assert issubclass(layerwise.InputError, layerwise.LayerwiseError)


PUBLIC_MODULES = {"analyze", "ray", "errors", "store", "serve", "explore", "reference", "cli"}


def test_every_module_is_public_or_marked_internal():
    # the documented API's modules, their packages' __init__, and the entry points are public; every
    # other module has an underscore in its path (as httpx does), so a user can tell the two apart
    from pathlib import Path

    root = Path(layerwise.__file__).parent
    unmarked = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[0] in ("__init__", "__main__") or any(p.startswith("_") and p not in ("__init__", "__main__")
                                                       for p in parts):  # fmt: skip
            continue
        if parts[0] in PUBLIC_MODULES and (len(parts) == 1 or parts[1:] in (("__init__",), ("__main__",))):
            continue
        if parts[0] == "reference":  # the from-scratch BERT: a package to read, every module of it
            continue
        unmarked.append("/".join(parts))
    assert not unmarked, f"name these _internal or add them to the documented API: {unmarked}"


def test_the_api_page_lists_exactly_the_public_names():
    import re
    from pathlib import Path

    from layerwise import errors

    page = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text(encoding="utf-8")
    listed = re.findall(r"^::: layerwise\.(\w+)$", page, flags=re.MULTILINE)
    assert len(listed) == len(set(listed)), "a name is listed twice"
    error_classes = {n for n in layerwise.__all__ if isinstance(getattr(errors, n, None), type)}
    top_level = set(layerwise.__all__) - {"__version__"} - error_classes  # the errors: `::: layerwise.errors`
    namespaces = {"errors", "serve", "explore", "reference"}  # lw.store's calls are top-level names
    assert set(listed) == top_level | namespaces
    assert PUBLIC_MODULES - {"store", "cli"} <= set(listed)
