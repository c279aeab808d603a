import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import layerwise as lw
from layerwise.cli import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from layerwise.cli import app\n"
        "for args in (['--help'], ['extract', '--help'], ['show', '--help']):\n"
        "    result = CliRunner().invoke(app, args)\n"
        "    assert result.exit_code == 0, result.output\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_extract_txt_to_npz(tmp_path, make_tiny_model):
    model = make_tiny_model("bert")
    source = tmp_path / "texts.txt"
    source.write_text("The bank raised rates.\n\nWe sat on the river bank.\n", encoding="utf-8")
    out = tmp_path / "out.npz"
    result = run("extract", source, "-o", out, "--model", model, "--layers", "0,-1", "--batch-size", 2)
    assert result.exit_code == 0, result.output
    data = np.load(out)
    meta = json.loads(str(data["meta"]))
    assert meta["model"] == str(model) and meta["layers"] == [0, 3] and meta["n_texts"] == 3
    assert data["layers"].tolist() == [0, 3]
    assert lw.read_npz_texts(data) == ["The bank raised rates.", "", "We sat on the river bank."]
    assert data["tokens_1"].tolist() == ["[CLS]", "[SEP]"]
    expected = lw.Encoder(model, device="cpu").extract(["We sat on the river bank."], layers=[0, -1])[0]
    np.testing.assert_allclose(data["hidden_2"], expected.hidden, atol=1e-5)
    assert data["tokens_2"].tolist() == list(expected.tokens)
    np.testing.assert_array_equal(data["offsets_2"], expected.offsets)
    assert "1 empty" in result.output
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files left


@pytest.mark.parametrize("pool", [None, "mean"])
def test_a_line_with_no_token_but_special_ones_counts_as_empty(tmp_path, make_tiny_model, pool):
    """NUL bytes and a zero-width space tokenise to [CLS] [SEP] alone, as an empty line does."""
    model = make_tiny_model("bert")
    source = tmp_path / "texts.txt"
    source.write_bytes("bank\n\x00\x00\n\u200b\n\nriver bank\n".encode())
    out = tmp_path / "out.npz"
    pooling = ["--pool", pool] if pool else []
    result = run("extract", source, "-o", out, "--model", model, "--layers", "0", *pooling)
    assert result.exit_code == 0, result.output
    assert "wrote 5 input(s)" in result.output and "(3 empty)" in result.output
    store = tmp_path / "s.lw"
    assert run("extract", source, "-o", store, "--model", model, "--layers", "0").exit_code == 0
    plan = lw.OutputPlan(layers=[0])
    assert lw.export_store(store, tmp_path / "e.npz", plan)["n_empty"] == 3


def test_extract_tsv_pairs_to_jsonl_in_input_order(tmp_path, make_tiny_model):
    model = make_tiny_model("bert")
    source = tmp_path / "pairs.tsv"
    source.write_text("Is it raining?\tYes, it is.\nA much longer first segment here\tok\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    result = run("extract", source, "-o", out, "--model", model, "--layers", "last2", "--dtype", "float16")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in records] == [0, 1]
    assert records[0]["text_pair"] == "Yes, it is."
    assert records[0]["segment_ids"] == [0] * 6 + [1] * 6
    assert np.asarray(records[0]["hidden"]).shape == (2, 12, 32)
    expected = lw.Encoder(model, device="cpu").extract(
        pairs=[("Is it raining?", "Yes, it is.")], layers="last2"
    )[0]
    np.testing.assert_array_equal(np.asarray(records[0]["hidden"]), expected.hidden.astype(np.float16))


def test_extract_jsonl_input(tmp_path, make_tiny_model):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "first"}\n\n{"text": "second one"}\n', encoding="utf-8")
    out = tmp_path / "out.npz"
    result = run("extract", source, "-o", out, "--model", make_tiny_model("bert"), "-q")
    assert result.exit_code == 0, result.output
    assert lw.read_npz_texts(np.load(out)) == ["first", "second one"]


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("bad.txt", b"fine\n\xff\xfe broken\n", "line 2 is not valid UTF-8"),
        ("bad.tsv", b"a\tb\nonly one column\n", "line 2 has 1 tab-separated column(s)"),
        (
            "bad.jsonl",
            b'{"text": "ok"}\n{"body": "no text"}\n',
            'line 2 needs an object with a string "text"',
        ),
        ("typo.jsonl", b'{"text": "ok"}\n{"txt": "typo"}\n', "line 2 has the field 'txt', not 'text'"),
        ("mixed.jsonl", b'{"text": "a", "text_pair": "b"}\n{"text": "c"}\n', "line 2: either every line"),
        ("broken.jsonl", b'{"text": \n', "line 1 is not valid JSON"),
        (
            "misspelled.jsonl",
            b'{"text": "hello", "text_pairs": "oops"}\n',
            "line 1 has the field 'text_pairs', not 'text_pair': rename it to 'text_pair'",
        ),
        ("blank.tsv", b"a\tb\n \t \nc\td\n", "line 2 holds only whitespace"),
    ],
)
def test_bad_input_files_name_the_line(tmp_path, make_tiny_model, name, content, fragment):
    source = tmp_path / name
    source.write_bytes(content)
    out = tmp_path / "out.npz"
    result = run("extract", source, "-o", out, "--model", make_tiny_model("bert"))
    assert result.exit_code == 2
    assert fragment in " ".join(result.output.split())
    assert not out.exists()


def test_invalid_utf8_can_be_replaced(tmp_path, make_tiny_model):
    source = tmp_path / "latin1.txt"
    source.write_bytes("café\n".encode("latin-1"))
    out = tmp_path / "out.npz"
    result = run(
        "extract", source, "-o", out, "--model", make_tiny_model("bert"), "--encoding-errors", "replace"
    )
    assert result.exit_code == 0, result.output
    assert lw.read_npz_texts(np.load(out)) == ["caf\ufffd"]


def test_cli_errors_for_bad_layers_suffix_and_model(tmp_path, make_tiny_model):
    source = tmp_path / "t.txt"
    source.write_text("x\n", encoding="utf-8")
    result = run(
        "extract", source, "-o", tmp_path / "o.npz", "--model", make_tiny_model("bert"), "--layers", "9"
    )
    assert result.exit_code == 2 and "layer 9 out of range: this model has 4 hidden states" in result.output
    result = run("extract", source, "-o", tmp_path / "o.h5")
    assert result.exit_code == 2 and "use .npz" in result.output
    result = run("extract", source, "-o", tmp_path / "o.npz", "--model", tmp_path / "missing")
    assert result.exit_code == 2 and "does not exist" in result.output
    assert not (tmp_path / "o.npz").exists()


def test_extract_sentence_pooling_with_fusion(tmp_path, make_tiny_model):
    model = make_tiny_model("bert")
    source = tmp_path / "t.txt"
    source.write_text("The bank raised rates.\nHi\n", encoding="utf-8")
    out = tmp_path / "s.npz"
    result = run(
        "extract", source, "-o", out, "--model", model, "--pool", "sentence:mean", "--fuse", "sum_last4"
    )
    assert result.exit_code == 0, result.output
    data = np.load(out)
    meta = json.loads(str(data["meta"]))
    assert meta["pool"] == "sentence:mean" and meta["fuse"] == "sum_last4" and meta["layers"] == [0, 1, 2, 3]
    expected = lw.Encoder(model, device="cpu").embed(["The bank raised rates.", "Hi"], fuse="sum_last4")
    np.testing.assert_allclose(data["embeddings"], expected, atol=1e-5)


def test_extract_word_pooling_jsonl_with_windows(tmp_path, make_tiny_model):
    model = make_tiny_model("bert")
    source = tmp_path / "t.txt"
    long_text = " ".join(f"word{i}" for i in range(40))
    source.write_text(f"Pre-split? No: raw text.\n{long_text}\n", encoding="utf-8")
    out = tmp_path / "w.jsonl"
    args = ["--model", model, "--pool", "word:mean", "--layers", "-1", "--max-length", "16"]
    result = run("extract", source, "-o", out, *args, "--long-texts", "window")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert records[0]["words"] == ["Pre", "-", "split", "?", "No", ":", "raw", "text", "."]
    assert np.asarray(records[0]["word_vectors"]).shape == (1, 9, 32)
    assert records[1]["words"] == long_text.split() and records[1]["words_lost"] == 0
    enc = lw.Encoder(model, device="cpu", max_length=16)
    expected = enc.embed_words([long_text], subword="mean", layers=-1, long_texts="window")[0]
    np.testing.assert_allclose(np.asarray(records[1]["word_vectors"]), expected.vectors[None], atol=1e-5)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["--pool", "sentence:median"],
            "pool 'sentence:median' is not valid; choose one of token, word:first",
        ),
        (["--fuse", "last"], "needs word or sentence pooling"),
        (["--pool", "word:mean", "--fuse", "best"], "fuse='best' is not valid"),
    ],
)
def test_pool_and_fuse_errors(tmp_path, make_tiny_model, args, fragment):
    source = tmp_path / "t.txt"
    source.write_text("x\n", encoding="utf-8")
    result = run("extract", source, "-o", tmp_path / "o.npz", "--model", make_tiny_model("bert"), *args)
    assert result.exit_code == 2
    assert fragment in " ".join(result.output.split())


def test_show_prints_tokens_and_layers(make_tiny_model):
    result = run("show", "The bank raised rates.", "--model", make_tiny_model("bert"))
    assert result.exit_code == 0, result.output
    for token in ("[CLS]", "bank", "raised", "[SEP]"):
        assert token in result.output
    assert "L0" in result.output and "L3" in result.output


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and result.output.strip() == f"layerwise {lw.__version__}"


def test_show_keeps_tokens_visible_when_piped_at_80_columns(make_tiny_model):
    env = {**__import__("os").environ, "COLUMNS": "80"}
    command = [sys.executable, "-m", "layerwise.cli", "show", "The bank raised interest rates again.",
               "--model", str(make_tiny_model("bert"))]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout
    for token in ("[CLS]", "bank", "raised", "interest", "rates", "again", "[SEP]"):
        assert f" {token} " in out
    assert "…" not in out  # no cell was cut short


def test_output_that_is_the_input_is_refused(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "a", "label": 1}\n', encoding="utf-8")
    result = CliRunner().invoke(app, ["extract", str(data), "-o", str(tmp_path / "." / "data.jsonl")])
    assert result.exit_code == 2 and "is the input file" in " ".join(result.output.split())
    # also when a glob or a folder names it: the check reads the corpus' files, not the arguments
    for given in (str(tmp_path / "*.jsonl"), str(tmp_path)):
        result = CliRunner().invoke(app, ["extract", given, "-o", str(data)])
        assert result.exit_code == 2 and "is the input file" in " ".join(result.output.split()), given
    assert data.read_text(encoding="utf-8") == '{"text": "a", "label": 1}\n'
    assert data.read_text(encoding="utf-8") == '{"text": "a", "label": 1}\n'


def _terminated_extract(tmp_path: Path, model: Path, launcher: list[str], wait: float) -> tuple[int, str]:
    """``launcher extract`` of a large corpus, sent SIGTERM ``wait`` seconds after its temp
    file appears: its exit code (-1 if it did not exit within 60 s) and its stderr."""
    import signal
    import time

    source = tmp_path / "t.txt"
    source.write_text("\n".join(f"sentence number {i} about the bank " * 3 for i in range(20000)) + "\n")
    out = tmp_path / "out.npz"
    command = [*launcher, "extract", str(source), "-o", str(out), "-q", "--model", str(model)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not list(tmp_path.glob(".out.npz.*.tmp")) and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
    time.sleep(wait)
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(60)
    except subprocess.TimeoutExpired:
        code = -1
    finally:
        process.kill()
    return code, process.stderr.read().decode() if process.stderr else ""


def test_sigterm_leaves_no_temp_files(tmp_path, make_tiny_model):
    module = [sys.executable, "-m", "layerwise.cli"]
    code, stderr = _terminated_extract(tmp_path, make_tiny_model("bert"), module, 0.3)
    assert code == 143, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]


def test_sigterm_exits_without_waiting_for_a_worker_thread_that_never_ends(tmp_path, make_tiny_model):
    """A worker thread stuck mid-batch (here: waiting on an event nobody sets) must not keep a
    terminated run from exiting, nor from removing its temp files."""
    script = (
        "import sys, threading\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from layerwise.cli import main\n"
        "ThreadPoolExecutor(1).submit(threading.Event().wait)  # joined at a normal exit: forever\n"
        "sys.argv = ['layerwise', *sys.argv[1:]]\n"
        "main()\n"
    )
    code, stderr = _terminated_extract(tmp_path, make_tiny_model("bert"), [sys.executable, "-c", script], 0)
    assert code == 143, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("data.json", ".json files are not read as one JSON document"),
        ("data.zip", ".zip files are not read as an archive"),
    ],
)
def test_unsupported_inputs_are_refused_before_reading(tmp_path, name, fragment):
    result = run("extract", name, "-o", tmp_path / "o.npz")
    assert result.exit_code == 2 and fragment in result.output, result.output
    assert not (tmp_path / "o.npz").exists()


def test_jsonl_lone_surrogate_names_the_line(tmp_path):
    source = tmp_path / "t.jsonl"
    source.write_text('{"text": "fine"}\n{"text": "bad \\ud800 escape"}\n', encoding="utf-8")
    result = run("extract", source, "-o", tmp_path / "o.npz")
    assert result.exit_code == 2
    assert "t.jsonl: line 2, field 'text': holds the lone surrogate U+D800" in result.output


def test_error_messages_print_user_values_verbatim(tmp_path, make_tiny_model):
    # rich markup in a user value must be printed, not interpreted (or crash the error printer)
    source = tmp_path / "corpus [draft].txt"
    source.write_text("x\n", encoding="utf-8")
    result = run(
        "extract", source, "-o", tmp_path / "o.npz", "--model", make_tiny_model("bert"), "--layers", "[/bold]"
    )
    assert result.exit_code == 2
    assert "layer spec '[/bold]' is not understood" in result.output
    result = run("extract", tmp_path / "missing [draft].txt", "-o", tmp_path / "o.npz")
    assert result.exit_code == 2 and "missing [draft].txt" in result.output


def test_analyze_and_plot_refuse_pairs_and_take_encoding_errors(tmp_path, make_tiny_model):
    pairs = tmp_path / "p.tsv"
    pairs.write_text("a bank\tthe river\nthe bank\ta loan\n", encoding="utf-8")
    result = run("analyze", pairs, "-o", tmp_path / "rep", "--model", make_tiny_model("bert"))
    assert result.exit_code == 2 and "holds text pairs" in result.output and not (tmp_path / "rep").exists()
    latin1 = tmp_path / "l.txt"
    latin1.write_bytes("caf\xe9 bank\nthe bank\nbank bank\n".encode("latin-1"))
    args = ["plot", latin1, "--words", "bank", "-o", tmp_path / "f.png", "--model", make_tiny_model("bert")]
    result = run(*args)
    assert result.exit_code == 2 and "pass --encoding-errors replace" in result.output
    result = run(*args, "--encoding-errors", "replace")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("rate", ["-1", "nan", "0"])
def test_pretrain_refuses_a_learning_rate_that_cannot_train(tmp_path, rate):
    corpus = tmp_path / "c.txt"
    corpus.write_text("one.\ntwo.\n\nthree.\nfour.\n", encoding="utf-8")
    result = run("pretrain", corpus, "-o", tmp_path / "m", "--learning-rate", rate)
    assert result.exit_code == 2 and "must be a positive number" in result.output
    assert not (tmp_path / "m").exists()


def test_extract_no_packed_uses_the_hugging_face_forward(tmp_path, make_tiny_model, monkeypatch):
    """--no-packed must reach the engine (no packed forward at all) and give the same numbers."""
    from layerwise._model.forward.packed import PackedEncoder

    model = make_tiny_model("bert")
    source = tmp_path / "texts.txt"
    source.write_text("The bank raised rates.\nWe sat on the river bank.\n", encoding="utf-8")
    assert run("extract", source, "-o", tmp_path / "packed.npz", "--model", model).exit_code == 0

    def refuse(*args, **kwargs):
        raise AssertionError("the packed forward ran")

    monkeypatch.setattr(PackedEncoder, "forward", refuse)
    result = run("extract", source, "-o", tmp_path / "hf.npz", "--model", model, "--no-packed")
    assert result.exit_code == 0, result.output
    packed, hf = np.load(tmp_path / "packed.npz"), np.load(tmp_path / "hf.npz")
    for i in range(2):
        np.testing.assert_allclose(packed[f"hidden_{i}"], hf[f"hidden_{i}"], atol=1e-5)


def test_the_ray_group_fills_its_defaults_in_one_place():
    # extract and cache both run Ray with RayOptions.sizes(): 2 actors of 1 thread unless given
    from layerwise.cli._groups import RayOptions

    assert RayOptions("local").sizes() == (2, 1)
    assert RayOptions("auto", workers=3, threads_per_worker=4).sizes() == (3, 4)
    assert RayOptions("local", workers=3).given() == {"--workers": 3, "--threads-per-worker": None,
                                                       "--shard-size": None}  # fmt: skip
