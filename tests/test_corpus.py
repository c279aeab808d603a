"""Corpora in (Parquet, CSV, TSV, JSON Lines, text; compressed; stdin; globs) with their ids, and
pooled vectors out as Parquet that other tools read."""

import bz2
import gzip
import json
import lzma
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import layerwise as lw
from layerwise._files.writers import read_npz_ids, read_npz_texts
from layerwise._inputs.corpus import Corpus

TEXTS = [f"Sentence {i}: the bank by the river" + " and the hills" * (i % 4) for i in range(23)]
IDS = [f"doc-{i:03d}" for i in range(23)]
MEAN = lw.OutputPlan.parse(pool="sentence:mean", layers="all")


def write_parquet(path, texts=TEXTS, ids=IDS, row_group_size=5, **extra):
    pq.write_table(pa.table({"doc_id": ids, "body": texts, **extra}), path, row_group_size=row_group_size)
    return path


def expected(encoder, texts, pairs=None):
    """Sentence means of every hidden state, computed by embed: the independent path."""
    return encoder.embed(texts, text_pairs=pairs, layers="all", pool="mean")


def read_parquet_vectors(path, n_layers):
    table = pq.read_table(path)
    return table, np.stack(
        [np.stack(table[f"layer_{i}"].to_numpy(zero_copy_only=False)) for i in range(n_layers)], axis=1
    )


# ---------------------------------------------------------------------------------------- formats
def test_parquet_in_parquet_out_keeps_ids_and_numbers(tmp_path, tiny_encoder):
    source = write_parquet(tmp_path / "corpus.parquet")
    out = tmp_path / "vectors.parquet"
    summary = lw.extract_to_file(
        tiny_encoder, lw.Corpus(source, text_column="body", id_column="doc_id"), out, MEAN
    )
    assert summary["n_texts"] == len(TEXTS) and summary["n_skipped"] == 0
    table, vectors = read_parquet_vectors(out, tiny_encoder.n_hidden_states)
    assert table["id"].to_pylist() == IDS and table["text"].to_pylist() == TEXTS
    np.testing.assert_allclose(vectors, expected(tiny_encoder, TEXTS), atol=1e-5)
    lengths = [len(e) for e in tiny_encoder.tokenize(TEXTS)]
    assert table["n_tokens"].to_pylist() == lengths
    meta = json.loads(table.schema.metadata[b"layerwise"])
    assert meta["model"] == tiny_encoder.name and meta["pool"] == "sentence:mean"
    assert len(meta["weights_sha256"]) == 64 and meta["layerwise_version"] == lw.__version__


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz", ".csv.bz2", ".csv.xz", ".csv.zst"])
def test_csv_pairs_with_ids(tmp_path, tiny_encoder, suffix):
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["id", "q", "a"])
    for i, text in enumerate(TEXTS):
        writer.writerow([i * 10, text, f'answer, "quoted" {i}\nover two lines'])
    data = buffer.getvalue().encode()
    path = tmp_path / f"pairs{suffix}"
    path.write_bytes(_compress(data, suffix))
    out = tmp_path / "out.npz"
    lw.extract_to_file(
        tiny_encoder, lw.Corpus(path, text_column="q", pair_column="a", id_column="id"), out, MEAN
    )
    npz = np.load(out)
    pairs = [f'answer, "quoted" {i}\nover two lines' for i in range(len(TEXTS))]
    assert read_npz_ids(npz) == [i * 10 for i in range(len(TEXTS))]
    assert read_npz_texts(npz) == TEXTS and read_npz_texts(npz, "text_pairs") == pairs
    np.testing.assert_allclose(npz["embeddings"], expected(tiny_encoder, TEXTS, pairs), atol=1e-5)


def _compress(data: bytes, suffix: str) -> bytes:
    if suffix.endswith(".gz"):
        return gzip.compress(data)
    if suffix.endswith(".bz2"):
        return bz2.compress(data)
    if suffix.endswith(".xz"):
        return lzma.compress(data)
    if suffix.endswith(".zst"):
        import zstandard

        return zstandard.ZstdCompressor().compress(data)
    return data


def test_jsonl_with_named_fields_and_words(tmp_path, tiny_encoder):
    records = [{"key": f"k{i}", "tokens": t.split(), "other": i} for i, t in enumerate(TEXTS)]
    path = tmp_path / "words.jsonl.gz"
    path.write_bytes(gzip.compress("\n".join(json.dumps(r) for r in records).encode()))
    out = tmp_path / "words.jsonl"
    plan = lw.OutputPlan.parse(pool="word:mean", layers=-1)
    lw.extract_to_file(tiny_encoder, lw.Corpus(path, id_column="key", words_column="tokens"), out, plan)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == [f"k{i}" for i in range(len(TEXTS))]
    direct = tiny_encoder.embed_words([t.split() for t in TEXTS], layers=-1, subword="mean")
    for line, vectors in zip(lines, direct, strict=True):
        assert line["words"] == line["text"].split()
        np.testing.assert_allclose(np.asarray(line["word_vectors"])[0], vectors.vectors, atol=1e-5)


def test_tsv_with_header_and_default_tsv_pairs(tmp_path, tiny_encoder):
    table = tmp_path / "t.tsv"
    table.write_text("id\ttext\n" + "".join(f"{i}\t{t}\n" for i, t in enumerate(TEXTS[:4])))
    corpus = Corpus(table, text_column="text", id_column="id")
    block = next(corpus.blocks(10))
    assert block.texts == TEXTS[:4] and block.ids == [0, 1, 2, 3] and block.text_pairs is None
    pairs = tmp_path / "p.tsv"
    pairs.write_text("a\tb\n\nc\td\n")
    block = next(Corpus(pairs).blocks(10))
    assert (block.texts, block.text_pairs, block.ids) == (["a", "c"], ["b", "d"], [0, 1])


def test_glob_folder_and_limit_read_files_in_sorted_order(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    write_parquet(folder / "b.parquet", TEXTS[10:], IDS[10:])
    write_parquet(folder / "a.parquet", TEXTS[:10], IDS[:10])
    (folder / "_SUCCESS").write_text("")  # a marker, not data
    for source in (folder, str(folder / "*.parquet"), [folder / "a.parquet", folder / "b.parquet"]):
        corpus = Corpus(source, text_column="body", id_column="doc_id")
        assert [t for b in corpus.blocks(7) for t in b.texts] == TEXTS
    limited = Corpus(folder, text_column="body", limit=12)
    blocks = list(limited.blocks(5))
    assert [len(b) for b in blocks] == [5, 5, 2] and blocks[-1].ids == [10, 11]  # rows across files


def test_reading_from_a_start_skips_what_comes_before(tmp_path):
    """A Ray actor reads its shard from the offset the driver's scan recorded."""
    path = tmp_path / "c.txt"
    path.write_text("".join(f"{t}\n" for t in TEXTS))
    corpus = Corpus(path)
    scan = corpus.scan(ranges=8)
    assert sorted(scan.starts) == [0, 8, 16] and scan.starts[8][1].offset == sum(
        len(t) + 1 for t in TEXTS[:8]
    )
    block = next(corpus.blocks(8, start=8, stop=16))
    assert block.texts == TEXTS[8:16] and block.ids == list(range(8, 16))
    parquet = Corpus(write_parquet(tmp_path / "c.parquet"), text_column="body", id_column="doc_id")
    parquet.scan(ranges=8)
    assert next(parquet.blocks(8, start=16)).ids == IDS[16:]


def test_stdin_and_txt_give_what_parquet_gives(tmp_path, tiny_encoder):
    source = tmp_path / "c.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    base = [sys.executable, "-m", "layerwise.cli", "extract", "--model", str(tiny_encoder.source)]
    args = ["--pool", "sentence:mean", "-q"]
    subprocess.run([*base, "-", "--format", "txt", "-o", str(tmp_path / "s.parquet"), *args],
                   input=source.read_bytes(), check=True)  # fmt: skip
    subprocess.run([*base, str(source), "-o", str(tmp_path / "t.parquet"), *args], check=True)
    parquet = write_parquet(tmp_path / "c.parquet", ids=list(range(len(TEXTS))))
    subprocess.run([*base, str(parquet), "--text-column", "body", "-o", str(tmp_path / "p.parquet"), *args],
                   check=True)  # fmt: skip
    n = tiny_encoder.n_hidden_states
    tables = [read_parquet_vectors(tmp_path / f"{name}.parquet", n) for name in "stp"]
    for table, vectors in tables:
        assert table["id"].to_pylist() == list(range(len(TEXTS)))
        np.testing.assert_array_equal(vectors, tables[0][1])


# ---------------------------------------------------------------------------------------- bad rows
@pytest.mark.parametrize(
    ("make", "options", "message"),
    [
        (lambda p: write_parquet(p / "x.parquet"), {"text_column": "text"},
         r"x\.parquet: no column 'text' \(--text-column\); its columns are 'doc_id', 'body'"),
        (lambda p: write_parquet(p / "x.parquet", texts=[*TEXTS[:3], None, *TEXTS[4:]]),
         {"text_column": "body"},
         r"x\.parquet: row 4, column 'body': null"),
        (lambda p: write_parquet(p / "x.parquet", number=list(range(23))), {"text_column": "number"},
         r"column 'number' \(--text-column\) holds int64, not text"),
        (lambda p: _write(p / "x.csv", "id,q,a\n1,one,uno\n2,two,\n"),
         {"text_column": "q", "pair_column": "a", "id_column": "id"},
         r"x\.csv: row 2, column 'a': null beside a text"),
        (lambda p: _write(p / "x.jsonl", '{"text": "a"}\n{"text": 5}\n'), {},
         r'x\.jsonl: line 2 needs an object with a string "text" field'),
        (lambda p: _write(p / "x.jsonl", '{"body": "a"}\n{"body": 5}\n'), {"text_column": "body"},
         r"x\.jsonl: line 2, field 'body': int \(5\), not a text"),
        (lambda p: _write(p / "x.jsonl", '{"body": "a", "id": 1}\n{"body": "b"}\n'),
         {"text_column": "body", "id_column": "id"}, r"x\.jsonl: line 2, field 'id': the field is missing"),
        (lambda p: _write(p / "x.txt", b"fine\n\xff bad\n"), {}, r"x\.txt: line 2 is not valid UTF-8"),
    ],
)  # fmt: skip
def test_a_bad_row_names_file_row_and_column_and_nothing_is_written(tmp_path, tiny_encoder, make, options,
                                                                      message):  # fmt: skip
    source = make(tmp_path)
    out = tmp_path / "out" / "v.parquet"
    out.parent.mkdir()
    with pytest.raises(lw.InputError, match=message):
        lw.extract_to_file(tiny_encoder, lw.Corpus(source, **options), out, MEAN)
    assert list(out.parent.iterdir()) == []


def _write(path, content):
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def test_skipped_rows_are_counted_and_recorded(tmp_path, tiny_encoder):
    texts = [*TEXTS[:3], None, *TEXTS[4:10], None, *TEXTS[11:]]
    source = write_parquet(tmp_path / "x.parquet", texts=texts)
    out = tmp_path / "v.parquet"
    summary = lw.extract_to_file(
        tiny_encoder, lw.Corpus(source, text_column="body", id_column="doc_id", on_bad_row="skip"), out, MEAN
    )
    assert summary["n_skipped"] == 2 and summary["n_texts"] == 21
    table = pq.read_table(out)
    assert table["id"].to_pylist() == [i for t, i in zip(texts, IDS, strict=True) if t is not None]
    assert json.loads(table.schema.metadata[b"layerwise"])["n_skipped"] == 2
    # without an id column the id is the source row, skipped rows included
    rows = Corpus(source, text_column="body", on_bad_row="skip")
    assert [i for b in rows.blocks(50) for i in b.ids] == [i for i, t in enumerate(texts) if t is not None]


def test_cli_reports_bad_rows_and_lists_columns(tmp_path, tiny_encoder):
    from typer.testing import CliRunner

    from layerwise.cli import app

    source = write_parquet(tmp_path / "x.parquet")
    out = str(tmp_path / "v.parquet")
    model = ["--model", str(tiny_encoder.source)]
    result = CliRunner().invoke(app, ["extract", str(source), "-o", out, *model, "--pool", "sentence:mean"])
    assert result.exit_code == 2 and "its columns are 'doc_id', 'body'" in result.output
    result = CliRunner().invoke(app, ["extract", str(source), "-o", out, *model, "--text-column", "body"])
    assert result.exit_code == 2 and "--pool sentence:MODE" in result.output  # token level: not Parquet


# ---------------------------------------------------------------------------------------- Parquet out
def test_parquet_output_is_read_by_duckdb_and_datasets(tmp_path, tiny_encoder):
    duckdb = pytest.importorskip("duckdb")
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "v.parquet"
    plan = lw.OutputPlan.parse(pool="sentence:mean", fuse="concat_last4")
    lw.extract_to_file(tiny_encoder, lw.Corpus.from_inputs(TEXTS, ids=IDS), out, plan)
    want = tiny_encoder.embed(TEXTS, pool="mean", fuse="concat_last4")
    rows = duckdb.sql(f"select id, fused_concat_last4 from '{out}' order by id").fetchall()
    assert [r[0] for r in rows] == IDS
    np.testing.assert_allclose(np.asarray([r[1] for r in rows], dtype=np.float32), want, atol=1e-5)
    ds = datasets.load_dataset("parquet", data_files=str(out), split="train", cache_dir=str(tmp_path / "c"))
    assert ds["id"] == IDS and ds["text"] == TEXTS
    np.testing.assert_allclose(np.asarray(ds["fused_concat_last4"], dtype=np.float32), want, atol=1e-5)


def test_parquet_word_level_float16_and_no_text(tmp_path, tiny_encoder):
    out = tmp_path / "w.parquet"
    plan = lw.OutputPlan.parse(pool="word:first", layers="0,-1", dtype="float16")
    lw.extract_to_file(tiny_encoder, TEXTS, out, plan, keep_text=False)
    table = pq.read_table(out)
    assert (
        "text" not in table.column_names
        and table.schema.field("layer_0").type.value_type.value_type == pa.float16()
    )
    direct = tiny_encoder.embed_words(TEXTS, layers="0,-1", subword="first")
    for i, words in enumerate(direct):
        assert table["words"][i].as_py() == list(words.words)
        got = np.asarray(table["layer_3"][i].as_py(), dtype=np.float32)
        np.testing.assert_allclose(got, words.vectors[1].astype(np.float16).astype(np.float32), atol=1e-3)


# ---------------------------------------------------------------------------------------- stores
def test_store_keeps_ids_and_export_pools_its_tokens(tmp_path, tiny_encoder):
    source = write_parquet(tmp_path / "c.parquet")
    store = tmp_path / "c.lw"
    lw.extract_to_store(
        tiny_encoder,
        lw.Corpus(source, text_column="body", id_column="doc_id"),
        store,
        lw.OutputPlan(dtype="float32"),
        layout=lw.StoreLayout(block_size=7),
    )
    opened = lw.open_store(store)
    assert opened.manifest.sort_by("text_id")["id"].to_pylist() == IDS
    for out in (tmp_path / "e.parquet", tmp_path / "e.npz", tmp_path / "e.jsonl"):
        lw.export_store(store, out, lw.OutputPlan.parse(pool="sentence:mean", layers="all"))
    direct = tmp_path / "d.parquet"
    lw.extract_to_file(tiny_encoder, lw.Corpus(source, text_column="body", id_column="doc_id"), direct, MEAN)
    n = tiny_encoder.n_hidden_states
    (exported, vectors), (_, want) = (
        read_parquet_vectors(tmp_path / "e.parquet", n),
        read_parquet_vectors(direct, n),
    )
    assert exported["id"].to_pylist() == IDS and exported["text"].to_pylist() == TEXTS
    np.testing.assert_allclose(vectors, want, atol=1e-6)
    npz = np.load(tmp_path / "e.npz")
    assert read_npz_ids(npz) == IDS
    np.testing.assert_allclose(npz["embeddings"], want, atol=1e-6)
    assert [json.loads(line)["id"] for line in (tmp_path / "e.jsonl").read_text().splitlines()] == IDS


def test_export_refuses_what_it_cannot_do(tmp_path, tiny_encoder):
    store = tmp_path / "c.lw"
    lw.extract_to_store(tiny_encoder, TEXTS, store, lw.OutputPlan.parse(dtype="float16", layers="0,-1"))
    with pytest.raises(lw.LayerSpecError, match=r"hidden state\(s\) \[1\] are not in"):
        lw.export_store(store, tmp_path / "e.parquet", lw.OutputPlan.parse(pool="sentence:mean", layers=1))
    pooled = tmp_path / "p.lw"
    lw.extract_to_store(
        tiny_encoder, TEXTS, pooled, lw.OutputPlan.parse(dtype="float16", pool="sentence:mean")
    )
    with pytest.raises(lw.OptionError, match="already pooled"):
        lw.export_store(pooled, tmp_path / "e.parquet")
    assert not (tmp_path / "e.parquet").exists()


def test_sharded_store_from_a_file_keeps_ids(tmp_path, tiny_encoder):
    """The plan lw.ray makes: the driver scans, each shard reads its own rows (here without Ray)."""
    from layerwise.store._shard_writer import begin_sharded_store, write_shard

    corpus = Corpus(write_parquet(tmp_path / "c.parquet"), text_column="body", id_column="doc_id")
    plan = lw.OutputPlan(dtype="float16")
    table = begin_sharded_store(
        tmp_path / "s.lw", model=tiny_encoder.name, plan=plan, n_hidden_states=tiny_encoder.n_hidden_states,
        texts=corpus, text_pairs=None, shard_size=10, overwrite=False,
    )  # fmt: skip
    listed = begin_sharded_store(
        tmp_path / "t.lw", model=tiny_encoder.name, plan=plan, n_hidden_states=tiny_encoder.n_hidden_states,
        texts=TEXTS, text_pairs=None, shard_size=10, overwrite=False,
    )  # fmt: skip
    assert [s["texts_sha256"] for s in table["shards"]] == [s["texts_sha256"] for s in listed["shards"]]
    for k, shard in enumerate(table["shards"]):
        block = next(corpus.blocks(shard["stop"] - shard["start"], start=shard["start"]))
        write_shard(tiny_encoder, tmp_path / "s.lw", table, k, block.texts, None, plan, ids=block.ids)
    store = lw.open_store(tmp_path / "s.lw")
    assert store.complete and store.manifest.sort_by("text_id")["id"].to_pylist() == IDS


def test_the_ray_plan_reads_a_file_corpus_once(tmp_path, monkeypatch):
    """One pass counts the texts, records where shards start and hashes the shards of every size
    the plan may pick; the table is the one a pass with the picked size alone gives."""
    from layerwise.ray import PLANNED_SIZES, auto_shard_size
    from layerwise.store._shard_table import new_table

    source = tmp_path / "big.txt"
    source.write_text("".join(f"text number {i}\n" for i in range(5000)), encoding="utf-8")
    passes = []
    original = Corpus._good_rows

    def counted(self, *args, **kwargs):
        passes.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Corpus, "_good_rows", counted)
    corpus = Corpus(source)
    n = corpus.scan(ranges=PLANNED_SIZES).n_texts
    size = auto_shard_size(n, workers=2)
    assert (n, size) == (5000, 1024) and size in PLANNED_SIZES
    table = new_table(model="m", plan_meta={}, corpus=corpus, shard_size=size, settings={})
    assert len(passes) == 1 and len(table["shards"]) == 5
    alone = new_table(model="m", plan_meta={}, corpus=Corpus(source), shard_size=size, settings={})
    assert [s["texts_sha256"] for s in table["shards"]] == [s["texts_sha256"] for s in alone["shards"]]
    assert table["texts_sha256"] == alone["texts_sha256"] and len(passes) == 2
    block = next(corpus.blocks(1024, start=3072))  # a shard reads from its recorded start
    assert block.texts[0] == "text number 3072" and len(passes) == 3


def test_auto_shard_size_picks_a_planned_size_for_large_corpora():
    from layerwise.ray import PLANNED_SIZES, auto_shard_size

    assert auto_shard_size(500, workers=2) == 250  # one shard per worker
    assert auto_shard_size(2047, workers=2) == 1024
    for n in (2048, 50_000, 100_000, 2_000_000, 10**8):
        assert auto_shard_size(n, workers=2) in PLANNED_SIZES
    assert auto_shard_size(50_000, workers=2) == 2048 and auto_shard_size(2_000_000, workers=2) == 4096


def test_as_corpus_takes_a_corpus_a_path_or_texts_and_names_options_that_do_not_fit(tmp_path):
    # the writers' one way in (no keyword pass-through): a path may take a format, a column and the
    # decoding rule; a Corpus and texts in memory take none (build the Corpus with its options)
    from layerwise._inputs.corpus import as_corpus

    table = tmp_path / "t.csv"
    table.write_text("id,body\n1,first text\n2,second text\n", encoding="utf-8")
    corpus = as_corpus(table, text_column="body")
    assert [list(b.texts) for b in corpus.blocks(10)] == [["first text", "second text"]]
    assert as_corpus(corpus) is corpus
    assert [list(b.texts) for b in as_corpus(["a", "b"]).blocks(10)] == [["a", "b"]]
    with pytest.raises(lw.OptionError, match=r"\(text_column\) to the Corpus"):
        as_corpus(corpus, text_column="body")
    with pytest.raises(lw.OptionError, match="format read columns of a file"):
        as_corpus(["a"], format="csv")
    with pytest.raises(lw.InputError, match="does not exist"):
        as_corpus(tmp_path / "missing.txt")
