import subprocess
import sys

import layerwise


def test_all_is_sorted_and_resolves():
    assert layerwise.__all__ == sorted(layerwise.__all__)
    for name in layerwise.__all__:
        assert getattr(layerwise, name) is not None


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
