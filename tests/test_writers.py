import numpy as np
import pytest

from layerwise._files.writers import write_results
from layerwise.errors import OptionError


def test_failure_midway_leaves_no_file(tmp_path, tiny_encoder):
    stacks = tiny_encoder.extract(["one", "two"])

    def results():
        yield 0, stacks[0]
        raise RuntimeError("disk on fire")

    for name in ("out.npz", "out.jsonl"):
        with pytest.raises(RuntimeError, match="disk on fire"):
            write_results(tmp_path / name, results(), texts=["one", "two"], meta={"model": "m"})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_an_interruption_mid_entry_is_what_the_caller_sees_and_leaves_no_file(
    tmp_path, tiny_encoder, monkeypatch, stop
):
    """SIGTERM (SystemExit) or Ctrl-C between an .npz entry's opening and its writing leaves it
    open, and the archive then refuses to close (ValueError): the interruption must reach the
    caller, not that."""
    from layerwise._files import blocks

    stacks = tiny_encoder.extract(["one", "two"])
    put, opened = blocks.put_array, []

    def interrupted(zf, name, values):
        if name.startswith("tokens_"):
            opened.append(zf.open(f"{name}.npy", "w", force_zip64=True))  # the signal lands here
            raise stop()
        put(zf, name, values)

    monkeypatch.setattr(blocks, "put_array", interrupted)
    with pytest.raises(stop):
        write_results(tmp_path / "out.npz", enumerate(stacks), texts=["one", "two"], meta={"model": "m"})
    assert opened and list(tmp_path.iterdir()) == []


def test_existing_file_survives_a_failed_write(tmp_path, tiny_encoder):
    target = tmp_path / "out.npz"
    target.write_bytes(b"previous")

    def results():
        raise RuntimeError("boom")
        yield  # pragma: no cover

    with pytest.raises(RuntimeError):
        write_results(target, results(), texts=["x"], meta={})
    assert target.read_bytes() == b"previous"


def test_missing_results_are_an_error(tmp_path, tiny_encoder):
    stack = tiny_encoder.extract(["one"])[0]
    with pytest.raises(RuntimeError, match="expected 2 results, got 1"):
        write_results(tmp_path / "o.npz", iter([(0, stack)]), texts=["one", "two"], meta={})
    assert list(tmp_path.iterdir()) == []


def test_npz_round_trip_without_pickle(tmp_path, tiny_encoder):
    stacks = tiny_encoder.extract(["café 東京", "x"])
    write_results(tmp_path / "o.npz", enumerate(stacks), texts=["café 東京", "x"], meta={"model": "m"})
    data = np.load(tmp_path / "o.npz", allow_pickle=False)
    for i, stack in enumerate(stacks):
        np.testing.assert_array_equal(data[f"hidden_{i}"], stack.hidden)
        assert data[f"tokens_{i}"].tolist() == list(stack.tokens)
        np.testing.assert_array_equal(data[f"word_ids_{i}"], stack.word_ids)
    assert "text_pairs" not in data.files


def test_bad_output_folder(tmp_path, tiny_encoder):
    with pytest.raises(OptionError, match="does not exist; create it first"):
        write_results(tmp_path / "no" / "o.npz", iter([]), texts=[], meta={})


def test_texts_are_stored_compactly(tmp_path, tiny_encoder):
    """0.1 stored texts as a fixed-width <U array: one long line made every text as wide as it."""
    import layerwise as lw

    texts = ["x " * 50_000, *(["short"] * 300), "café \ud800 東京"]
    from layerwise._features.stream import SentenceVector

    sentence = SentenceVector(np.zeros(4, dtype=np.float32))
    write_results(tmp_path / "o.npz", ((i, sentence) for i in range(len(texts))), texts=texts, meta={})
    assert (tmp_path / "o.npz").stat().st_size < 200_000  # 0.1: 302 x 400 KB = 120 MB
    assert lw.read_npz_texts(np.load(tmp_path / "o.npz")) == texts


def test_output_mode_follows_the_umask_and_stale_temp_files_go(tmp_path, tiny_encoder):
    import os

    stale = tmp_path / ".o.npz.999999999.abcd1234.tmp"  # a writer that was SIGKILLed
    stale.write_bytes(b"x" * 100)
    old_style = tmp_path / ".o.npz.k2j3h4.tmp"  # 0.1's name
    old_style.write_bytes(b"x")
    stacks = tiny_encoder.extract(["one"])
    previous = os.umask(0o022)
    try:
        write_results(tmp_path / "o.npz", enumerate(stacks), texts=["one"], meta={})
    finally:
        os.umask(previous)
    assert (tmp_path / "o.npz").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.npz"]


@pytest.fixture
def nan_model(tmp_path, make_tiny_model):
    """The tiny BERT with one NaN weight: feature 0 is NaN from hidden state 2 on."""
    import shutil

    import torch
    from transformers import AutoModel

    folder = tmp_path / "nan-model"
    shutil.copytree(make_tiny_model("bert"), folder)
    model = AutoModel.from_pretrained(folder)
    with torch.no_grad():
        model.encoder.layer[1].output.LayerNorm.weight[0] = float("nan")
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("packed", [True, False])  # each forward's batches take the same way to the host
def test_nan_in_a_hidden_state_is_an_error_naming_the_input_and_layer(tmp_path, nan_model, packed):
    import layerwise as lw

    encoder = lw.Encoder(nan_model, device="cpu", packed=packed)
    assert encoder.engine.runs_packed("hidden_states", ()) is packed
    with pytest.raises(
        lw.errors.NonFiniteError, match=r"input 0 \('first text'\) at hidden state 2"
    ) as caught:
        encoder.extract(["first text", "second"])
    assert (caught.value.index, caught.value.layer) == (0, 2)
    with pytest.raises(lw.errors.NonFiniteError):
        lw.extract_to_file(encoder, ["first text", "second"], tmp_path / "out.npz")
    assert not list(tmp_path.glob("out*"))  # nothing half-written


def test_allow_nan_keeps_them_with_a_warning_and_jsonl_stays_json(tmp_path, nan_model, caplog):
    import json
    import logging

    import layerwise as lw

    encoder = lw.Encoder(nan_model, device="cpu", allow_nan=True)
    with caplog.at_level(logging.WARNING, logger="layerwise"):
        stacks = encoder.extract(["first text", "second"])
    assert np.isnan(stacks[0].hidden[2:, :, 0]).all() and np.isfinite(stacks[0].hidden[:2]).all()
    assert "2 input(s) have NaN or inf in their hidden states (first: input 0)" in caplog.text
    out = tmp_path / "nan.jsonl"
    lw.extract_to_file(encoder, ["first text", "second"], out)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]  # strict JSON
    assert "NaN" not in out.read_text(encoding="utf-8")
    hidden = records[0]["hidden"]
    assert hidden[2][0][0] is None and hidden[1][0][0] == pytest.approx(float(stacks[0].hidden[1, 0, 0]))


def test_quiet_hides_progress_never_the_nan_error_or_warning(tmp_path, nan_model):
    import subprocess
    import sys

    source = tmp_path / "in.txt"
    source.write_text("first text\nsecond\n", encoding="utf-8")
    base = [
        sys.executable,
        "-m",
        "layerwise.cli",
        "extract",
        str(source),
        "--model",
        str(nan_model),
        "--quiet",
    ]
    refused = subprocess.run([*base, "-o", str(tmp_path / "a.npz")], capture_output=True, text=True)
    assert (
        refused.returncode == 2
        and "NaN or inf for input 0 ('first text') at hidden state 2" in refused.stderr
    )
    assert not (tmp_path / "a.npz").exists()
    kept = subprocess.run(
        [*base, "-o", str(tmp_path / "b.npz"), "--allow-nan"], capture_output=True, text=True
    )
    assert kept.returncode == 0 and "have NaN or inf in their hidden states" in kept.stderr
    assert (tmp_path / "b.npz").exists()


@pytest.mark.parametrize("name", ["out.npz", "out.jsonl", "out.parquet"])
def test_disk_full_is_a_clean_error_and_leaves_nothing(tmp_path, tiny_encoder, monkeypatch, name):
    import errno

    import layerwise as lw
    from layerwise._files import blocks as file_writers
    from layerwise._files import parquet as parquet_writer

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if name.endswith(".npz"):
        monkeypatch.setattr(file_writers, "put_array", full)
    elif name.endswith(".jsonl"):
        monkeypatch.setattr(file_writers.JsonlWriter, "end_block", full)
    else:
        monkeypatch.setattr(parquet_writer.ParquetWriter, "end_block", full)
    plan = lw.OutputPlan.parse(pool="sentence:mean") if name.endswith(".parquet") else None
    with pytest.raises(lw.OutputError, match=r"No space left on device; nothing was written\. Free"):
        lw.extract_to_file(tiny_encoder, ["one", "two"], tmp_path / name, plan)
    assert list(tmp_path.iterdir()) == []
