"""A command checks the extras its options need before it reads a corpus or loads a model: without
one it fails at once with the command that installs it, leaving nothing behind (a probe ran for
minutes and then said matplotlib was missing; Parquet output loaded the model first)."""

from __future__ import annotations

import sys
import time

import pytest
from typer.testing import CliRunner

from layerwise._encoder import Encoder
from layerwise.cli import app

CONLLU = "# text = The bank rose .\n1\tThe\t_\tDET\n2\tbank\t_\tNOUN\n3\trose\t_\tVERB\n4\t.\t_\tPUNCT\n\n"


@pytest.fixture
def place(tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the missing extra was named")

    monkeypatch.setattr(Encoder, "from_settings", no_model)
    monkeypatch.setattr(Encoder, "__init__", no_model)
    (tmp_path / "texts.txt").write_text("The bank raised rates.\nA second text.\n")
    (tmp_path / "texts.parquet").write_bytes(b"PAR1")  # never opened: the missing pyarrow is said first
    (tmp_path / "train.conllu").write_text(CONLLU)
    (tmp_path / "pairs.tsv").write_text("sentence1\tsentence2\tscore\na\tb\t1\nc\td\t2\ne\tf\t3\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


# (the module hidden, the extra named, the command's arguments, what must not be written)
CASES = [
    ("pyarrow", "io", ["extract", "texts.txt", "-o", "v.parquet", "--pool", "mean"], "v.parquet"),
    ("pyarrow", "io", ["extract", "texts.parquet", "-o", "v.npz"], "v.npz"),  # a corpus read with it
    ("zarr", "store", ["extract", "texts.txt", "-o", "v.lw"], "v.lw"),
    ("ray", "distributed", ["extract", "texts.txt", "-o", "v.lw", "--ray", "local"], "v.lw"),
    ("datasets", "cache", ["cache", "texts.txt", "-o", "acts", "--tokens", "64"], "acts"),
    ("ray", "distributed", ["cache", "texts.txt", "-o", "acts", "--tokens", "64", "--ray", "local"], "acts"),
    ("sklearn", "probe", ["probe", "conllu", "--train", "train.conllu", "--dev", "train.conllu"], None),
    (
        "matplotlib",
        "plot",
        ["probe", "conllu", "--train", "train.conllu", "--dev", "train.conllu", "--plot", "c.png"],
        "c.png",
    ),
    ("matplotlib", "plot", ["probe", "pairs", "--data", "pairs.tsv", "--plot", "c.png"], "c.png"),
    ("matplotlib", "plot", ["analyze", "texts.txt", "-o", "report"], "report"),
    ("matplotlib", "plot", ["plot", "texts.txt", "-o", "w.png", "--words", "bank"], "w.png"),
    ("uvicorn", "serve", ["serve", "--port", "8765"], None),
]


@pytest.mark.parametrize(("hidden", "extra", "args", "written"), CASES, ids=lambda v: str(v)[:40])
def test_a_missing_extra_fails_before_the_model_loads(hidden, extra, args, written, place, monkeypatch):
    monkeypatch.setitem(sys.modules, hidden, None)  # as if not installed
    started = time.perf_counter()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"pip install 'layerwise[{extra}]'" in result.output, result.output
    assert time.perf_counter() - started < 10  # at once, not after a probe's minutes
    if written is not None:
        assert not (place / written).exists()


def test_the_hint_names_the_package_pip_installs(monkeypatch):
    from layerwise._settings.extras import require
    from layerwise.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "sklearn", None)
    with pytest.raises(MissingDependencyError, match=r"needs scikit-learn: .*pip install scikit-learn\)"):
        require("probe")
