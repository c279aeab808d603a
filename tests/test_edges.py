"""The input boundaries answer with a message that names the file and what is wrong, exit 2, and
nothing written: never a silently shorter corpus, a traceback or a wrong status (#46)."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import asgi_posts, needs_smollm2, smollm2_folder
from typer.testing import CliRunner

import layerwise as lw
from layerwise.cli import app

LINES = "".join(f"line number {i} with eight words in it\n" for i in range(20_000)).encode()


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def model(make_tiny_model) -> Path:
    return make_tiny_model("bert", 2)


COMPRESSED = {
    "gz": gzip.compress,
    "bz2": bz2.compress,
    "xz": lzma.compress,
    "zst": lambda data: zstandard.ZstdCompressor().compress(data),
}


@pytest.mark.parametrize("suffix", sorted(COMPRESSED))
def test_a_truncated_compressed_file_is_an_error(tmp_path, model, suffix):
    data = COMPRESSED[suffix](LINES)
    path = tmp_path / f"t.txt.{suffix}"
    path.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out.npz"
    result = cli("extract", path, "-o", out, "--model", model, "--layers", 0)
    assert result.exit_code == 2, result.output
    assert f"{path}: the" in result.output and "ends in the middle of its data" in result.output
    assert not out.exists()


def test_a_zst_of_several_frames_reads_whole(tmp_path, model):
    frames = [
        zstandard.ZstdCompressor().compress(b"a b\nc d\n"),
        zstandard.ZstdCompressor().compress(b"e f\n"),
    ]
    path = tmp_path / "t.txt.zst"
    path.write_bytes(b"".join(frames))
    corpus = lw.Corpus(path)
    assert len(corpus) == 3
    assert [t for block in corpus.blocks(10) for t in block.texts] == ["a b", "c d", "e f"]


def test_a_gz_that_is_not_gzip_is_named(tmp_path, model):
    path = tmp_path / "t.txt.gz"
    path.write_bytes(b"plain text\n")
    result = cli("extract", path, "-o", tmp_path / "o.npz", "--model", model)
    assert (
        result.exit_code == 2 and "is not a gzip file" in result.output and "Traceback" not in result.output
    )


def test_corrupt_parquet_pages_are_named(tmp_path, model):
    path = tmp_path / "c.parquet"
    pq.write_table(
        pa.table({"text": [f"text number {i} " * 20 for i in range(2000)]}), path, compression="snappy"
    )
    data = bytearray(path.read_bytes())
    for k in range(200, 5000, 7):  # the data pages; the footer at the end stays valid
        data[k] ^= 0x5A
    path.write_bytes(bytes(data))
    result = cli("extract", path, "-o", tmp_path / "o.npz", "--model", model)
    assert result.exit_code == 2, result.output
    assert str(path) in result.output and "cannot be read" in result.output
    assert not (tmp_path / "o.npz").exists()


def test_a_glob_or_folder_leaves_layerwise_outputs_out(tmp_path, model):
    """#46, 2: a rerun read its own earlier output as more texts (40 rows, then 80)."""
    folder = tmp_path / "gl"
    folder.mkdir()
    for k in range(2):
        pq.write_table(
            pa.table({"text": [f"part {k} text {i}" for i in range(10)]}), folder / f"p{k}.parquet"
        )
    args = ["--model", model, "--pool", "sentence:mean", "--layers", -1]
    for _ in range(2):
        result = cli("extract", f"{folder}/*.parquet", "-o", folder / "out.parquet", *args)
        assert result.exit_code == 0, result.output
        assert pq.read_table(folder / "out.parquet").num_rows == 20
    result = cli("extract", folder, "-o", folder / "out2.parquet", *args)
    assert result.exit_code == 0 and pq.read_table(folder / "out2.parquet").num_rows == 20
    # named on its own, an output is read (its text column)
    assert len(lw.Corpus(folder / "out.parquet")) == 20


def test_integer_ids_past_int64_are_refused_while_reading(tmp_path, model):
    """#46, 10: the OverflowError came after the model had run; a store was left with 0 texts."""
    jsonl = tmp_path / "big.jsonl"
    jsonl.write_text(json.dumps({"text": "a b", "id": 2**64 - 1}) + "\n")
    result = cli("extract", jsonl, "-o", tmp_path / "x.lw", "--model", model, "--id-column", "id")
    assert result.exit_code == 2 and "past what a 64-bit integer holds" in result.output
    assert not (tmp_path / "x.lw").exists()
    parquet = tmp_path / "big.parquet"
    pq.write_table(pa.table({"text": ["a", "b"], "id": pa.array([1, 2**64 - 1], pa.uint64())}), parquet)
    result = cli("extract", parquet, "-o", tmp_path / "x.parquet", "--model", model, "--id-column", "id",
                 "--pool", "sentence:mean")  # fmt: skip
    assert result.exit_code == 2 and "row 2, column 'id'" in result.output


@pytest.mark.parametrize("part", ["data", "offsets"])
def test_a_flipped_byte_in_a_zarr_json_is_damage(tmp_path, model, part):
    """#46, 9: verify and export crashed with UnicodeDecodeError."""
    (tmp_path / "t.txt").write_text("a b c\nd e f\n")
    store = tmp_path / "s.lw"
    assert cli("extract", tmp_path / "t.txt", "-o", store, "--model", model).exit_code == 0
    meta = store / part / "zarr.json"
    data = bytearray(meta.read_bytes())
    data[10] = 0xFF
    meta.write_bytes(bytes(data))
    verified = cli("verify", store)
    assert verified.exit_code == 1 and "DAMAGED" in verified.output and f"{part}/" in verified.output
    exported = cli("export", store, "-o", tmp_path / "e.parquet")
    assert exported.exit_code == 1 and "DAMAGED" in exported.output and "is damaged" in exported.output
    with pytest.raises(lw.StoreDamagedError):
        lw.open_store(store)


def _copy_model(model: Path, folder: Path) -> Path:
    shutil.copytree(model, folder)
    return folder


def test_a_tokenizer_of_another_vocabulary_is_refused(tmp_path, model):
    """#46, 4: tokenizer.json with ids shifted by 2 from vocab.txt extracted without a word."""
    shifted = _copy_model(model, tmp_path / "shifted")
    document = json.loads((shifted / "tokenizer.json").read_text())
    size = len(document["model"]["vocab"])
    document["model"]["vocab"] = {t: (i + 2) % size for t, i in document["model"]["vocab"].items()}
    for added in document["added_tokens"]:
        added["id"] = (added["id"] + 2) % size
    (shifted / "tokenizer.json").write_text(json.dumps(document))
    with pytest.raises(
        lw.ModelLoadError, match=r"tokenizer.json and vocab.txt .* give 30,522 of 30,522 tokens"
    ):
        lw.Encoder(shifted, device="cpu")
    (tmp_path / "t.txt").write_text("a bank\n")
    result = cli("extract", tmp_path / "t.txt", "-o", tmp_path / "x.npz", "--model", shifted)
    assert result.exit_code == 2 and "not the same vocabulary" in result.output
    # special tokens whose ids differ from the config's
    padded = _copy_model(model, tmp_path / "padded")
    config = json.loads((padded / "config.json").read_text())
    config["pad_token_id"] = 5
    (padded / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        lw.ModelLoadError, match=r"config.json's pad_token_id 5 is '\[unused4\]' in the tokenizer"
    ):
        lw.Encoder(padded, device="cpu")
    lw.Encoder(_copy_model(model, tmp_path / "same"), device="cpu")  # its own files: loads


def test_two_swapped_ids_in_tokenizer_json_are_refused(tmp_path, model):
    """#55, 6: "the" and "bank" swapped in tokenizer.json against vocab.txt extracted with no
    warning (the check allowed 1 % of the entries to differ); a token listed twice in vocab.txt
    is still accepted."""
    swapped = _copy_model(model, tmp_path / "swapped")
    document = json.loads((swapped / "tokenizer.json").read_text())
    vocab = document["model"]["vocab"]
    vocab["the"], vocab["bank"] = vocab["bank"], vocab["the"]
    (swapped / "tokenizer.json").write_text(json.dumps(document))
    with pytest.raises(
        lw.ModelLoadError, match=r"give 2 of 30,522 tokens different ids \('the': 1996 in vocab"
    ):
        lw.Encoder(swapped, device="cpu")
    (tmp_path / "t.txt").write_text("the bank\n")
    result = cli("extract", tmp_path / "t.txt", "-o", tmp_path / "x.npz", "--model", swapped)
    assert result.exit_code == 2 and "'bank': 2924 in vocab.txt, 1996 in tokenizer.json" in result.output
    # a duplicated line in vocab.txt: WordPiece keeps one of its ids, either is the file's
    twice = _copy_model(model, tmp_path / "twice")
    lines = (twice / "vocab.txt").read_text().split("\n")
    lines[-2] = lines[1000]  # the last token becomes a second copy of token 1000
    (twice / "vocab.txt").write_text("\n".join(lines))
    document = json.loads((twice / "tokenizer.json").read_text())
    del document["model"]["vocab"][
        next(t for t, i in document["model"]["vocab"].items() if i == len(lines) - 2)
    ]
    (twice / "tokenizer.json").write_text(json.dumps(document))
    lw.Encoder(twice, device="cpu")


def test_csv_names_its_bad_rows_and_reads_large_ones(tmp_path, model):
    """#46, 13: invalid UTF-8 and ragged rows named; --encoding-errors replace works on CSV; a row
    larger than pyarrow's block is read (the block grows)."""
    bad = tmp_path / "u.csv"
    bad.write_bytes(b"text\nok\n\xff\xfe\nfine\n")
    result = cli("extract", bad, "-o", tmp_path / "x.npz", "--model", model)
    assert result.exit_code == 2 and f"{bad}: row 2 is not valid UTF-8" in result.output
    assert (
        cli(
            "extract", bad, "-o", tmp_path / "x.npz", "--model", model, "--encoding-errors", "replace"
        ).exit_code
        == 0
    )
    assert lw.read_npz_texts(np.load(tmp_path / "x.npz"))[1] == "\ufffd\ufffd"
    skipped = cli("extract", bad, "-o", tmp_path / "s.npz", "--model", model, "--on-bad-row", "skip")
    assert skipped.exit_code == 0 and lw.read_npz_texts(np.load(tmp_path / "s.npz")) == ["ok", "fine"]
    ragged = tmp_path / "r.csv"
    ragged.write_text("text,b\nok,1\nragged\n")
    result = cli("extract", ragged, "-o", tmp_path / "r.npz", "--model", model)
    assert result.exit_code == 2 and "a row has 1 column(s) where the header has 2: 'ragged'" in result.output
    large = tmp_path / "large.csv"
    large.write_text('text\nshort\n"' + "x " * 1_500_000 + '"\nafter\n')  # 3 MB in one cell
    assert [len(t) for t in lw.Corpus(large).blocks(10).__next__().texts] == [5, 3_000_000, 5]


def test_csv_with_a_quote_left_open_at_the_end_is_an_error(tmp_path, model):
    """#55, 7: an unterminated quote swallowed the rest of the file into one text, exit 0."""
    open_quote = tmp_path / "unq.csv"
    open_quote.write_text('text\nok\n"a,b\nmore lines here\nand another\n')
    result = cli("extract", open_quote, "-o", tmp_path / "x.npz", "--model", model)
    assert result.exit_code == 2 and "row 2 opens a quoted field that is never closed" in result.output
    assert not (tmp_path / "x.npz").exists()
    # a bare quote inside an unquoted field, and escaped quotes, are CSV: read as they are
    inches = tmp_path / "inch.csv"
    inches.write_text('text\n5" screen\n"say ""hi"""\n')
    assert [t for b in lw.Corpus(inches).blocks(10) for t in b.texts] == ['5" screen', 'say "hi"']


def test_standard_input_is_named_so(tmp_path, model, monkeypatch):
    """#46, 17: errors named the temporary file standard input was spooled to."""
    result = CliRunner().invoke(
        app, ["extract", "-", "--format", "csv", "-o", str(tmp_path / "x.npz"), "--model", str(model)],
        input=b"text,b\nok,1\nragged\n",
    )  # fmt: skip
    assert result.exit_code == 2 and "standard input: a row has 1 column(s)" in result.output
    assert "layerwise-stdin" not in result.output


@pytest.mark.parametrize("name", ["c.txt.lz4", "c.tar.gz", "c.tgz", "c.txt.br"])
def test_archives_and_unknown_compressions_are_refused(tmp_path, model, name):
    """#46, 17: .lz4 and .tar.gz were read as plain text."""
    path = tmp_path / name
    path.write_bytes(b"\x04\x22\x4d\x18binary")
    result = cli("extract", path, "-o", tmp_path / "x.npz", "--model", model)
    assert result.exit_code == 2 and (
        "is an archive" in result.output or "compression is not read" in result.output
    )


def test_messages_that_name_what_to_do(tmp_path, model):
    """#46, 17: export onto a .lw; a plain extract onto a sharded store."""
    (tmp_path / "t.txt").write_text("a b\nc d\n")
    assert cli("extract", tmp_path / "t.txt", "-o", tmp_path / "s.lw", "--model", model).exit_code == 0
    result = cli("export", tmp_path / "s.lw", "-o", tmp_path / "good.lw")
    assert (
        result.exit_code == 2 and "names a store" in result.output and "unknown suffix" not in result.output
    )
    from test_sharded_store import write_sharded

    write_sharded(lw.Encoder(model, device="cpu"), tmp_path / "sh.lw", shard_size=1, texts=["a b", "c d"])
    result = cli("extract", tmp_path / "t.txt", "-o", tmp_path / "sh.lw", "--model", model, "--overwrite")
    assert result.exit_code == 2 and "is a sharded store" in result.output and "--ray" in result.output


@needs_smollm2
def test_a_truncated_gguf_file_says_so(tmp_path):
    gguf = next(smollm2_folder().glob("*.gguf"))
    cut = tmp_path / "cut.gguf"
    with open(gguf, "rb") as source, open(cut, "wb") as out:
        out.write(source.read(gguf.stat().st_size // 2))
    with pytest.raises(
        lw.ModelLoadError, match=r"GGUF file .*cut.gguf' cannot be read .*truncated or damaged"
    ):
        lw.Encoder(cut, device="cpu")


def test_help_keeps_every_value_at_80_columns():
    """#46, 20: rich help cut `word:first|last|…` and `--special-toke…` at 80 columns."""
    text = (
        CliRunner().invoke(app, ["extract", "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"}).output
    )
    flat = " ".join(text.split())
    for needed in ("word:first|last|mean|first_last|max", "--special-tokens", "--encoding-errors",
                   "[default: packaged all-MiniLM-L6-v2]", "--final-norm"):  # fmt: skip
        assert needed in flat, needed
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80


def test_the_suite_writes_only_under_temporary_folders():
    """#46, 25: the corpus page's load_dataset wrote into ~/.cache/huggingface."""
    import tempfile

    datasets = pytest.importorskip("datasets")
    assert (
        Path(datasets.config.HF_DATASETS_CACHE)
        .resolve()
        .is_relative_to(Path(tempfile.gettempdir()).resolve())
    )


def test_tokens_are_shown_as_people_read_them(decoder_encoder, tiny_encoder):
    """#46, 23: byte-level BPE pieces ('ĠParis', 'Ã©') and SentencePiece's '▁' and '<0x0A>'."""
    from layerwise._inputs.display import token_display

    gpt2 = decoder_encoder("gpt2").tokenizer
    shown = token_display(gpt2)
    assert shown("ĠParis") == " Paris" and shown("Ã©") == "é" and shown("Ċ") == "\n"
    pieces = gpt2.convert_ids_to_tokens(gpt2("the bank of the river\n")["input_ids"])
    assert "".join(shown(p) for p in pieces) == "the bank of the river\n"
    llama = token_display(decoder_encoder("llama").tokenizer)
    assert llama("▁Paris") == " Paris" and llama("<0x0A>") == "\n"
    assert token_display(tiny_encoder.tokenizer)("##ing") == "##ing"  # WordPiece reads as it is


def test_request_shapes_the_server_refuses_are_in_its_schema(tiny_encoder):
    """#46, 15: OpenAI's `input` on /v1/layers is named for what it is; an empty list says so on both
    endpoints with its own field as param; the OpenAPI schema says what is refused."""
    pytest.importorskip("fastapi")

    from layerwise.serve import ServeSettings, create_app

    app = create_app({"m": tiny_encoder}, ServeSettings(model_process=False))
    requests = [
        ("/v1/layers", {"input": ["a"]}),
        ("/v1/layers", {"texts": []}),
        ("/v1/embeddings", {"input": []}),
    ]
    as_input, empty_texts, empty_input = (r.json()["error"] for r in asgi_posts(app, requests))
    assert "this endpoint takes texts" in as_input["message"] and as_input["param"] == "input"
    assert empty_texts == {
        **empty_texts,
        "param": "texts",
        "message": "texts is an empty list; send at least one input",
    }
    assert empty_input["param"] == "input" and empty_input["message"].startswith("input is an empty list")
    schemas = app.openapi()["components"]["schemas"]
    layers = schemas["LayersRequest"]
    assert len(layers["oneOf"]) == 3 and {"required": ["texts"]} in [
        {"required": o["required"]} for o in layers["oneOf"]
    ]
    assert any(
        branch.get("minItems") == 1 for branch in schemas["EmbeddingsRequest"]["properties"]["input"]["anyOf"]
    )


# ---------------------------------------------------------------------------- #55: edges and messages
def test_cache_final_norm_on_an_encoder_is_refused(tmp_path, model):
    """#55, 8: the last hidden state was stored unchanged as ln_final.hook_normalized, exit 0."""
    (tmp_path / "t.txt").write_text("a b c d e f g h i j k l m n o p q r s t u v w x y z\n" * 20)
    result = cli("cache", tmp_path / "t.txt", "-o", tmp_path / "acts", "--model", model, "--final-norm",
                 "last", "--context", "8", "--tokens", "64")  # fmt: skip
    assert result.exit_code == 2 and "model) has none (its last hidden state is its last" in result.output
    assert not (tmp_path / "acts").exists()


def test_cache_counts_and_context_name_the_fix(tmp_path, model):
    """#55, 10 and 19: --tokens 1e400 raised OverflowError; --context 2 printed the framing dict."""
    (tmp_path / "t.txt").write_text("a b c\n")
    huge = cli("cache", tmp_path / "t.txt", "-o", tmp_path / "a", "--model", model, "--tokens", "1e400")
    assert huge.exit_code == 2 and "--tokens '1e400' is too large" in huge.output
    tight = cli("cache", tmp_path / "t.txt", "-o", tmp_path / "a", "--model", model, "--context", "2")
    assert tight.exit_code == 2 and "the smallest context that works is 3: choose --context 3" in tight.output


def test_cache_on_a_read_only_folder_says_so(tmp_path, model, monkeypatch):
    """#55, 11: a read-only folder (or a full disk, test_cache.py) gave a raw OSError, exit 1."""
    import errno

    import layerwise._cache.writer as cache_writer

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(cache_writer, "write_contexts", read_only)
    (tmp_path / "t.txt").write_text("a b c d e f g h\n" * 20)
    result = cli("cache", tmp_path / "t.txt", "-o", tmp_path / "acts", "--model", model, "--context", "8",
                 "--tokens", "64")  # fmt: skip
    assert result.exit_code == 2
    assert "writing cache" in result.output and "failed: the file system is read-only" in result.output


def test_a_second_cache_writer_is_told_it_is_a_cache(tmp_path, tiny_encoder):
    """#55, 21: the cache's lock error said "store 'CC'"."""
    from layerwise.store._lock import writer_lock

    path = tmp_path / "CC"
    path.mkdir()
    with writer_lock(path), pytest.raises(lw.StoreError, match=r"^cache .*CC' is being written by another"):
        lw.cache_activations(
            tiny_encoder, ["a b c d e f g h i j"] * 20, path, lw.CacheOptions(context=8, tokens=64)
        )


def test_info_names_bad_metadata_and_reads_a_cache(tmp_path, model):
    """#55, 13: bad JSON in a Parquet file's layerwise key gave JSONDecodeError; an empty .npz
    "Aborted!"; a cache folder "not a layerwise store", in the CLI and in lw.read_meta."""
    table = pa.table({"x": [1]}).replace_schema_metadata({b"layerwise": b"{not json"})
    pq.write_table(table, tmp_path / "bad.parquet")
    bad = cli("info", tmp_path / "bad.parquet")
    assert bad.exit_code == 2 and "its 'layerwise' schema metadata is not JSON" in bad.output
    (tmp_path / "empty.npz").write_bytes(b"")
    empty = cli("info", tmp_path / "empty.npz")
    assert (
        empty.exit_code == 2
        and "is not an .npz that layerwise wrote" in empty.output
        and "Aborted" not in empty.output
    )
    (tmp_path / "t.txt").write_text("a b c d e f g h\n" * 20)
    assert cli("cache", tmp_path / "t.txt", "-o", tmp_path / "acts", "--model", model, "--context", "8",
               "--tokens", "64").exit_code == 0  # fmt: skip
    meta = lw.read_meta(tmp_path / "acts")
    assert meta["kind"] == "activation cache" and meta["context"] == 8 and meta["layers"] == [2]
    assert cli("info", tmp_path / "acts").exit_code == 0
    (tmp_path / "old.jsonl").write_text('{"text": "a"}\n')
    old = cli("info", tmp_path / "old.jsonl")
    assert "written by layerwise 0.2.0 or earlier" in old.output


def test_layers_json_path_is_checked_before_the_work(tmp_path, model):
    """#55, 14: --json /proc/x.json failed after the whole computation; --json FILE/x.json said
    the folder does not exist."""
    (tmp_path / "two.txt").write_text("one text here\ntwo texts there\n")
    unwritable = cli("layers", tmp_path / "two.txt", "--model", model, "--json", "/proc/x.json")
    assert unwritable.exit_code == 2 and "a file cannot be written in '/proc'" in unwritable.output
    assert "loading" not in unwritable.output  # refused before the model loads
    under_file = cli(
        "layers", tmp_path / "two.txt", "--model", model, "--json", tmp_path / "two.txt" / "x.json"
    )
    assert under_file.exit_code == 2 and "is a file, not a folder" in under_file.output


def test_layers_json_says_an_encoder_has_no_final_norm(tmp_path, model):
    """#55, 21: the layers JSON recorded final_norm true for an encoder; output files record null."""
    (tmp_path / "two.txt").write_text("one text here\ntwo texts there\nand a third one\n")
    result = cli("layers", tmp_path / "two.txt", "--model", model, "--json", tmp_path / "l.json")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "l.json").read_text())["made"]["settings"]["final_norm"] is None


def test_a_damaged_shard_index_is_one_message_at_exit(tmp_path, model):
    """#55, 15: export printed the right error, then ~100 lines of asyncio's "Task was destroyed
    but it is pending!" and "Event loop is closed" as the process exited."""
    import subprocess
    import sys

    (tmp_path / "t.txt").write_text("\n".join(f"sentence number {i} of the corpus" for i in range(60)) + "\n")
    store = tmp_path / "s.lw"
    assert cli("extract", tmp_path / "t.txt", "-o", store, "--model", model, "--chunk-rows", "8",
               "--shard-chunks", "4").exit_code == 0  # fmt: skip
    index_of = store / "data" / "c" / "3" / "0" / "0"
    data = bytearray(index_of.read_bytes())
    data[-10] ^= 0xFF  # the shard's index of chunks, and its CRC32C
    index_of.write_bytes(bytes(data))
    run = subprocess.run(
        [sys.executable, "-m", "layerwise.cli", "export", str(store), "-o", str(tmp_path / "e.parquet")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1 and "DAMAGED" in run.stderr
    assert "Task was destroyed" not in run.stderr and "Event loop is closed" not in run.stderr, run.stderr


def test_a_pyarrow_that_fails_to_import_is_one_line(tmp_path):
    """#55, 16: a pyarrow broken by another cause (a numpy it was not built for) printed 40 lines."""
    import subprocess
    import sys

    fake = tmp_path / "fake" / "pyarrow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import sys\nsys.stderr.write('A module that was compiled using NumPy 1.x cannot be run in\\n' + "
        "'  File x\\n' * 40)\nraise ImportError('numpy.core.multiarray failed to import')\n"
    )
    (tmp_path / "t.csv").write_text("text\nhello\n")
    command = ["extract", str(tmp_path / "t.csv"), "-o", str(tmp_path / "x.npz")]
    run = subprocess.run(
        [sys.executable, "-m", "layerwise.cli", *command],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(tmp_path / "fake")},
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "pyarrow, which is installed but fails to import (ImportError: numpy.core.multiarray" in run.stderr
    assert "File x" not in run.stderr and len(run.stderr.strip().splitlines()) <= 3, run.stderr


def test_a_word_pool_given_to_embed_names_embed_words(model):
    """#55, 18: embed(pool="word:first") said "pool 'sentence:word:first' is not valid"."""
    enc = lw.Encoder(model, device="cpu")
    with pytest.raises(lw.OptionError, match=r"pool 'word:first' pools subwords into words.*embed_words"):
        enc.embed(["a b"], pool="word:first")
    with pytest.raises(lw.OptionError, match=r"pool 'sentence:mean' pools a whole text.*embed\(texts"):
        enc.embed_words([["a", "b"]], subword="sentence:mean")


def test_a_metric_with_no_signal_picks_nothing():
    """#55, 20: duplicate texts gave effective rank 1.0000015 at every layer, and "best": 1."""
    from layerwise._analysis.label_free import LayerMetrics
    from layerwise._analysis.layer_choice import recommend

    flat = np.asarray([1.0, 1.0000015, 1.0000012, 1.0000015])
    metrics = LayerMetrics((0, 1, 2, 3), {"effective_rank": flat, "dataset_entropy": np.full(4, np.nan)}, 5)
    assert metrics.picks() == {"effective_rank": None, "dataset_entropy": None}
    assert metrics.as_dict()["best"]["effective_rank"] is None
    assert recommend(metrics).rule.startswith(("middle", "last"))  # a rule that needs no metric
    varied = LayerMetrics((0, 1, 2, 3), {"effective_rank": np.asarray([1.0, 3.0, 9.0, 4.0])}, 5)
    assert varied.picks() == {"effective_rank": 2}


def test_the_bundled_model_by_its_short_name(tmp_path, monkeypatch):
    """#55, 21: the serving guide's --model all-MiniLM-L6-v2 failed offline."""
    from layerwise._model.loading.source import DEFAULT_MODEL, default_model_path, resolve_model_source

    monkeypatch.chdir(tmp_path)
    assert resolve_model_source("all-MiniLM-L6-v2") == (str(default_model_path()), DEFAULT_MODEL)
    (tmp_path / "all-MiniLM-L6-v2").mkdir()  # a folder of that name here is that folder
    with pytest.raises(lw.ModelLoadError):
        resolve_model_source("all-MiniLM-L6-v2")


def test_the_openapi_model_enum_lists_short_names(tiny_encoder):
    from layerwise.serve import create_app

    app = create_app({"org/tiny-model": tiny_encoder})
    schema = app.openapi()["components"]["schemas"]["EmbeddingsRequest"]["properties"]["model"]
    assert {"type": "string", "enum": ["org/tiny-model", "tiny-model"]} in schema["anyOf"]


def test_info_says_which_forward_ran_and_reads_an_older_record(tmp_path, model):
    """#84 item 6: ``info`` said "path packed" (a file path, to a reader), and read_meta's "path" was
    the forward, not the output. An output of 0.3 recorded the forward as "path": read as "forward"."""
    (tmp_path / "t.txt").write_text("The bank raised rates.\n")
    out = tmp_path / "v.npz"
    assert cli("extract", tmp_path / "t.txt", "-o", out, "--model", model, "-q").exit_code == 0
    meta = lw.read_meta(out)
    assert meta["path"] == str(out) and meta["forward"] == "packed"
    said = cli("info", out).output
    assert re.search(r"^forward\s+packed", said, re.M) and not re.search(r"^path\s+packed", said, re.M)
    with np.load(out) as npz:
        arrays = {name: npz[name] for name in npz.files}
    record = json.loads(str(arrays["meta"]))
    record["path"] = record.pop("forward")  # as 0.3 wrote it
    np.savez(tmp_path / "old.npz", **{**arrays, "meta": np.array(json.dumps(record))})
    old = lw.read_meta(tmp_path / "old.npz")
    assert old["path"] == str(tmp_path / "old.npz") and old["forward"] == "packed"
