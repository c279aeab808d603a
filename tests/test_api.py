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
