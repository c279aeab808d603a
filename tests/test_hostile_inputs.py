"""Every command with the bad values a hostile pass tried: no traceback, a message that says what is
wrong and what to do, the right exit code (2: a bad value; 1: damage), and nothing left on disk.

The cases follow the items of the pass: size options past their bounds, server limits of inf,
messages that named the wrong thing (a file called a folder, a cache called a store, a seed called
a count), and outputs whose suffix and kind disagree."""

from __future__ import annotations

import shutil

import pytest
from conftest import corpus
from typer.testing import CliRunner

from layerwise.cli import app

runner = CliRunner()


def run(*args, stdin: str | None = None):
    result = runner.invoke(app, [str(a) for a in args], input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args}: traceback instead of a message") from result.exception
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture(scope="module")
def place(tmp_path_factory, tiny_encoder):
    """A folder with a small text file, a store, an .npz and an activation cache of the tiny model."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "small.txt").write_text("\n".join(corpus(40)) + "\n", encoding="utf-8")
    model = tiny_encoder.source
    assert run("extract", root / "small.txt", "-o", root / "s.lw", "--model", model, "-q").exit_code == 0
    assert run("extract", root / "small.txt", "-o", root / "out.npz", "--model", model, "-q").exit_code == 0
    cache = ["--context", "16", "--tokens", "256", "--layers", "-1", "--model", model, "-q"]
    assert run("cache", root / "small.txt", "-o", root / "acts", *cache).exit_code == 0
    return root


def _entries(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (["--chunk-rows", "100000000"], "chunk_rows=100,000,000 is past its bound, 65,536"),
        (
            ["--shard-chunks", "100000000", "--chunk-rows", "100"],
            "shard_chunks=100,000,000 is past its bound",
        ),
        (["--chunk-rows", "1000000"], "chunk_rows=1,000,000 is past its bound"),
        (["--block-size", "10000000000"], "block_size=10,000,000,000 is past its bound"),
        (["--chunk-rows", "60000"], r"makes a chunk of .* MiB .*past its bound of 64 MiB.*--chunk-rows"),
        (
            ["--chunk-rows", "4096", "--shard-chunks", "4096"],
            r"make a shard of .*past its bound of 2,048 MiB",
        ),
    ],
)
def test_layout_options_past_their_cost_are_refused_before_any_file(place, tiny_encoder, layout, message):
    before = _entries(place)
    # the cost bounds need wide rows: the default model's (7 x 384 float16), not the tiny one's
    model = [] if "MiB" in message else ["--model", tiny_encoder.source]
    result = run("extract", place / "small.txt", "-o", place / "new.lw", *layout, *model)
    assert result.exit_code == 2
    assert __import__("re").search(message, result.output.replace("\n", " ")), result.output
    assert _entries(place) == before


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "-1"])
@pytest.mark.parametrize("option", ["--max-body-mb", "--max-response-mb", "--max-queue-mb"])
def test_server_size_limits_of_inf_are_refused(option, value):
    result = run("serve", option, value)
    assert result.exit_code == 2 and option in result.output


def test_serve_refuses_an_empty_host():
    result = run("serve", "--host", "")
    assert result.exit_code == 2 and "--host '' is not an address" in result.output


def test_verify_names_what_it_was_given(place, tmp_path):
    damaged = tmp_path / "acts"
    shutil.copytree(place / "acts", damaged)
    (damaged / "layerwise-cache.json").unlink()
    result = run("verify", damaged)
    assert (
        result.exit_code == 1
        and "DAMAGED" in result.output
        and "layerwise-cache.json, is missing" in result.output
    )
    for file in (place / "small.txt", place / "out.npz"):
        result = run("verify", file)
        assert result.exit_code == 2 and "is a file: verify checks a store folder" in result.output
        assert "NotADirectoryError" not in result.output and "DAMAGED" not in result.output
    (tmp_path / "empty").mkdir()
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "x").write_text("x")
    for folder, says in (
        (tmp_path / "empty", "is an empty folder"),
        (tmp_path / "foreign", "not a layerwise store"),
    ):
        result = run("verify", folder)
        assert result.exit_code == 2 and says in result.output and "will not write" not in result.output
    result = run("export", tmp_path / "foreign", "-o", tmp_path / "x.parquet")
    assert (
        result.exit_code == 2
        and "will not write" not in result.output
        and "give a store folder" in result.output
    )
    result = run("export", place / "acts", "-o", tmp_path / "x.parquet")
    assert result.exit_code == 2 and "is a layerwise activation cache, not a store" in result.output
    assert not (tmp_path / "x.parquet").exists()


def test_info_never_suggests_unsafe_loading(tmp_path):
    fake = tmp_path / "fake.npz"
    fake.write_text("hello\n")
    result = run("info", fake)
    assert result.exit_code == 2 and "is not an .npz that layerwise wrote" in result.output
    assert "allow_pickle" not in result.output and "pickle.load" not in result.output


def test_outputs_whose_path_and_kind_disagree(place, tmp_path, tiny_encoder):
    model = ["--model", tiny_encoder.source]
    result = run("extract", place / "small.txt", "-o", place / "small.txt" / "o.npz", *model)
    assert result.exit_code == 2 and "'small.txt' is a file, not a folder" in result.output.replace(
        str(place) + "/", ""
    )
    assert "loading" not in result.output  # refused before the model loads
    (tmp_path / "d.npz").mkdir()
    result = run("extract", place / "small.txt", "-o", tmp_path / "d.npz", *model)
    assert result.exit_code == 2 and ".npz names a file format" in result.output
    assert _entries(tmp_path / "d.npz") == []


def test_cache_seed_messages_say_seed(place, tmp_path):
    for value in ("-1", "nan", "1.5"):
        result = run("cache", place / "small.txt", "-o", tmp_path / "c", "--shuffle-seed", value)
        assert result.exit_code == 2 and "is not a seed: write a whole number from 0 up" in result.output
        assert "is not a count" not in result.output
    assert not (tmp_path / "c").exists()


def test_standard_input_defaults_to_text_lines(tmp_path, tiny_encoder):
    out = tmp_path / "x.npz"
    result = run(
        "extract", "-", "-o", out, "--model", tiny_encoder.source, "-q", stdin="one text\ntwo texts\n"
    )
    assert result.exit_code == 0, result.output
    import numpy as np

    with np.load(out) as npz:
        assert sum(name.startswith("hidden_") for name in npz.files) == 2


@pytest.mark.parametrize(
    ("hidden", "target", "extra"),
    [("zarr", "s.lw", "store"), ("pyarrow", "s.lw", "store"), ("datasets", "acts", "cache")],
)
def test_verify_without_an_extra_names_the_pip_command_not_damage(place, monkeypatch, hidden, target, extra):
    import sys

    import layerwise as lw
    from layerwise.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, hidden, None)  # as if not installed
    result = run("verify", place / target)
    assert result.exit_code == 2 and f"pip install 'layerwise[{extra}]'" in result.output
    assert "DAMAGED" not in result.output
    verify = lw.verify_store if target.endswith(".lw") else lw.verify_cache
    with pytest.raises(MissingDependencyError, match=f"pip install 'layerwise\\[{extra}\\]'"):
        verify(place / target)


def test_info_reads_the_layers_table_and_the_analyze_report(place, tiny_encoder):
    import layerwise as lw

    model = ["--model", tiny_encoder.source, "-q"]
    table = place / "layers.json"
    assert run("layers", place / "small.txt", "--json", table, *model).exit_code == 0
    meta = lw.read_meta(table)
    assert meta["kind"] == "layers table" and meta["layerwise_version"] == lw.__version__
    assert meta["model"] == tiny_encoder.name and meta["final_norm"] is None and meta["max_length"] is None
    assert run("analyze", place / "small.txt", "-o", place / "report", *model).exit_code == 0
    report = lw.read_meta(place / "report")
    assert report["kind"] == "analysis report" and report["source"] == str(place / "small.txt")
    assert report["model_dtype"] == tiny_encoder.settings.model_dtype and "device" in report
    shown = run("info", place / "report")
    assert shown.exit_code == 0 and "analysis report" in shown.output


def test_the_layout_help_states_the_bounds_the_store_enforces():
    import typer

    from layerwise.store._format import LAYOUT_LIMITS, MAX_CHUNK_BYTES, MAX_SHARD_BYTES

    extract = typer.main.get_command(app).commands["extract"]  # type: ignore[attr-defined]
    helps = {p.name: p.help for p in extract.params}
    assert f"at most {LAYOUT_LIMITS['block_size'][0]:,}]" in helps["block_size"]
    assert (
        f"at most {LAYOUT_LIMITS['chunk_rows'][0]:,} rows and {MAX_CHUNK_BYTES // 2**20} MiB"
        in helps["chunk_rows"]
    )
    shard = f"at most {LAYOUT_LIMITS['shard_chunks'][0]:,} chunks and {MAX_SHARD_BYTES // 2**30} GiB"
    assert shard in helps["shard_chunks"].replace("\n", " ")
