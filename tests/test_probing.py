"""Probing on tiny tasks with known answers."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import layerwise as lw
from layerwise._probing import control_labels, fit_predict
from layerwise._probing.tasks import bio_spans, entity_f1, read_conll2003, read_conllu
from layerwise.errors import InputError, OptionError

NOUNS = ["cat", "dog", "tree", "house", "river", "car"]
VERBS = ["runs", "sleeps", "eats", "falls", "sings", "waits"]


def write_conllu(path, sentences):
    lines = []
    for s, sentence in enumerate(sentences):
        lines.append(f"# sent_id = {s}")
        for i, (word, tag) in enumerate(sentence, start=1):
            lines.append(f"{i}\t{word}\t{word}\t{tag}\t_\t_\t0\troot\t_\t_")
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def pos_sentences(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [(rng.choice(NOUNS), "NOUN"), (rng.choice(VERBS), "VERB")]
        if rng.random() < 0.5:
            words = [("the", "DET"), *words]
        out.append(words)
    return out


@pytest.fixture
def pos_files(tmp_path):
    write_conllu(tmp_path / "train.conllu", pos_sentences(120, 0))
    write_conllu(tmp_path / "dev.conllu", pos_sentences(40, 1))
    return tmp_path / "train.conllu", tmp_path / "dev.conllu"


def test_probe_that_must_reach_100_percent(pos_files, tiny_encoder, tmp_path):
    """Tags are a function of the word, and every dev word occurs in training: the embedding layer
    of any model identifies the word, so the probe on L0 must be perfect."""
    train, dev = pos_files
    result = lw.probe("conllu", train=train, dev=dev, encoder=tiny_encoder, controls=("control_task",))
    rows = {r.name: r for r in result.rows}
    assert rows["L0"].score == 1.0
    assert [r.name for r in result.rows] == [
        "L0", "L1", "L2", "L3", "embeddings", "last", "second_to_last", "sum_last4", "mean_last4",
        "concat_last4", "sum_all", "mean_all", "scalar_mix",
    ]  # fmt: skip
    assert rows["embeddings"].score == rows["L0"].score and rows["last"].layers == (3,)
    assert result.best.score == 1.0
    assert len(result.scalar_mix_weights) == 4 and sum(result.scalar_mix_weights) == pytest.approx(1.0)
    assert 0 <= result.center_of_gravity <= 3
    assert result.n_train == sum(len(s) for s in pos_sentences(120, 0))
    words = f"{result.n_train:,} train / {result.n_dev:,} dev words from 120 / 40 sentences"
    assert result.sizes == words and words in result.table().title
    # controls are filled in and selectivity is accuracy minus control
    assert rows["L0"].control_task is not None
    assert rows["L0"].selectivity == pytest.approx(rows["L0"].accuracy - rows["L0"].control_task)
    result.to_json(tmp_path / "r.json")
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["metric"] == "accuracy" and sum(r["best"] for r in saved["rows"]) == 1
    result.plot(tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_control_task_sits_near_chance_on_unseen_types():
    """Random labels per word type cannot be predicted for types the probe never saw."""
    rng = np.random.default_rng(0)
    train_words = [[f"w{i}" for i in range(j, j + 10)] for j in range(0, 2000, 10)]
    dev_words = [[f"u{i}" for i in range(j, j + 10)] for j in range(0, 1000, 10)]
    labels = [["A", "B", "C", "D"][i % 4] for i in range(2000)]
    labels = [labels[j : j + 10] for j in range(0, 2000, 10)]
    mapping = control_labels(train_words, labels, train_words + dev_words, seed=0)
    assert set(mapping.values()) == {"A", "B", "C", "D"}
    assert mapping == control_labels(train_words, labels, train_words + dev_words, seed=0)  # deterministic
    # features that carry no information about the (unseen) type
    x_train, x_dev = rng.normal(size=(2000, 16)), rng.normal(size=(1000, 16))
    y_train = np.array([mapping[w] for s in train_words for w in s])
    y_dev = np.array([mapping[w] for s in dev_words for w in s])
    accuracy = (fit_predict(x_train, y_train, x_dev, seed=0) == y_dev).mean()
    assert abs(accuracy - 0.25) < 0.06


def test_linear_probe_separates_a_linear_task():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(600, 8))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int)
    assert (fit_predict(x[:400], y[:400], x[400:], seed=0) == y[400:]).mean() > 0.97


@pytest.mark.parametrize(
    ("tags", "spans"),
    [
        (["B-PER", "I-PER", "O", "B-LOC"], {("PER", 0, 2), ("LOC", 3, 4)}),
        (["I-PER", "I-PER", "O"], {("PER", 0, 2)}),  # IOB1: I- starts an entity after O
        (["B-PER", "B-PER"], {("PER", 0, 1), ("PER", 1, 2)}),
        (["I-ORG", "I-LOC"], {("ORG", 0, 1), ("LOC", 1, 2)}),  # a type change starts a new entity
        (["O", "O"], set()),
        (["B-MISC", "I-MISC", "I-MISC"], {("MISC", 0, 3)}),
    ],
)
def test_bio_spans(tags, spans):
    assert bio_spans(tags) == spans


def test_entity_f1_known_answers():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    assert entity_f1(gold, gold) == 1.0
    predicted = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "B-LOC"]]
    # tp = 2 (PER, ORG); gold 3; predicted 3 -> P = R = 2/3
    assert entity_f1(gold, predicted) == pytest.approx(2 / 3)
    wrong_boundary = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "O"]]  # PER cut short: not a match
    assert entity_f1(gold, wrong_boundary) == pytest.approx(2 / 3)
    assert entity_f1(gold, [["O"] * 4, ["O"] * 2]) == 0.0


def test_conll2003_probe_reports_entity_f1(tmp_path, tiny_encoder):
    def write(path, n, seed):
        rng = random.Random(seed)
        lines = ["-DOCSTART- -X- -X- O", ""]
        for _ in range(n):
            name = rng.choice(["John", "Mary", "Paris", "Berlin"])
            tag = "B-PER" if name in ("John", "Mary") else "B-LOC"
            lines += [f"{name} NNP B-NP {tag}", f"{rng.choice(VERBS)} VBZ B-VP O", ". . O O", ""]
        path.write_text("\n".join(lines), encoding="utf-8")

    write(tmp_path / "train.txt", 80, 0)
    write(tmp_path / "dev.txt", 30, 1)
    data = read_conll2003(tmp_path / "train.txt")
    assert data.words[0][1] in VERBS and data.labels[0][0] in ("B-PER", "B-LOC")
    result = lw.probe("conll", train=tmp_path / "train.txt", dev=tmp_path / "dev.txt", encoder=tiny_encoder,
                      controls=(), scalar_mix=False)  # fmt: skip
    assert result.metric == "entity F1"
    assert {r.name: r for r in result.rows}["L0"].score == 1.0


def test_sentence_classification_tsv(tmp_path, tiny_encoder):
    rng = random.Random(0)

    def write(path, n):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            good = rng.random() < 0.5
            rows.append(f"the {rng.choice(NOUNS)} is {'good' if good else 'bad'}\t{'pos' if good else 'neg'}")
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")

    write(tmp_path / "train.tsv", 100)
    write(tmp_path / "dev.tsv", 40)
    result = lw.probe("tsv", train=tmp_path / "train.tsv", dev=tmp_path / "dev.tsv", encoder=tiny_encoder,
                      controls=("random_model",))  # fmt: skip
    rows = {r.name: r for r in result.rows}
    assert rows["L0"].score == 1.0 and rows["L0"].random_model is not None
    assert result.table().title.endswith("(100 train / 40 dev sentences)")


def test_pairs_spearman_with_default_model(tmp_path, default_encoder):
    pairs = [
        ("A man is playing a guitar.", "A person plays the guitar.", 5.0),
        ("A man is playing a guitar.", "A man is playing a piano.", 3.0),
        ("A man is playing a guitar.", "Stocks fell sharply today.", 0.0),
        ("The cat sleeps on the sofa.", "A kitten naps on the couch.", 4.5),
        ("The cat sleeps on the sofa.", "The dog sleeps on the floor.", 2.5),
        ("The cat sleeps on the sofa.", "Parliament passed the budget.", 0.2),
    ]
    path = tmp_path / "pairs.tsv"
    path.write_text("sentence1\tsentence2\tscore\n" + "\n".join(f"{a}\t{b}\t{s}" for a, b, s in pairs) + "\n")
    result = lw.probe("pairs", data=path, encoder=default_encoder, controls=(), scalar_mix=False)
    assert result.metric == "Spearman" and result.table().title.endswith("(6 pairs)")
    assert {r.name: r for r in result.rows}["last"].score > 0.9


def test_store_fallback_equals_in_memory(pos_files, tiny_encoder):
    train, dev = pos_files
    options = {"train": train, "dev": dev, "encoder": tiny_encoder, "controls": (), "scalar_mix": False}
    in_memory = lw.probe("conllu", **options)
    on_disk = lw.probe("conllu", memory_budget=1, **options)
    for a, b in zip(in_memory.rows, on_disk.rows, strict=True):
        assert a.name == b.name and a.score == pytest.approx(b.score, abs=1e-9)


def test_probe_errors(tmp_path, tiny_encoder):
    with pytest.raises(OptionError, match="task='ner' is not valid"):
        lw.probe("ner", encoder=tiny_encoder)
    with pytest.raises(OptionError, match="needs train= and dev="):
        lw.probe("conllu", train=tmp_path / "x", encoder=tiny_encoder)
    # a generic fusion fuses layers a caller lists: refused by name (it failed an assertion inside)
    for task in ("conllu", "tsv", "pairs"):
        with pytest.raises(OptionError, match="'mean' fuses the layers you choose"):
            lw.probe(task, train=tmp_path / "x", dev=tmp_path / "y", encoder=tiny_encoder, fuses=("mean",))
    with pytest.raises(InputError, match="does not exist"):
        read_conllu(tmp_path / "missing.conllu")
    with pytest.raises(InputError, match="column 'pos' is not a CoNLL-U column"):
        read_conllu(tmp_path / "missing.conllu", "pos")


def test_cli_probe_conllu(pos_files, make_tiny_model, tmp_path):
    from typer.testing import CliRunner

    from layerwise.cli import app

    train, dev = pos_files
    outputs = ["--json", str(tmp_path / "p.json"), "--plot", str(tmp_path / "p.png")]
    model = str(make_tiny_model("bert"))
    args = [
        "probe",
        "conllu",
        "--train",
        str(train),
        "--dev",
        str(dev),
        "--model",
        model,
        "--controls",
        "none",
    ]
    args += outputs
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "◀ best" in result.output and "concat_last4" in result.output
    assert json.loads((tmp_path / "p.json").read_text())["task"] == "conllu:upos"
    assert (tmp_path / "p.png").exists()


def test_reader_faults_are_clean_errors(tmp_path):
    from layerwise._probing.tasks import read_table

    empty = tmp_path / "empty.conllu"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(InputError, match="no CoNLL-U sentences found"):
        read_conllu(empty)
    latin1 = tmp_path / "latin1.conllu"
    latin1.write_bytes("# c\n1\tcafé\tx\tNOUN\t_\t_\t0\troot\t_\t_\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"line 2 is not valid UTF-8 .*iconv -f latin1") as info:
        read_conllu(latin1)
    assert "--encoding-errors" not in str(info.value)  # probes have no such option
    bom = tmp_path / "bom.conllu"
    bom.write_text("\ufeff# sent_id = 1\n1\tThe\tthe\tDET\t_\t_\t0\troot\t_\t_\n", encoding="utf-8")
    assert read_conllu(bom).words == [["The"]]
    table = tmp_path / "t.tsv"
    table.write_text("\ufeffsentence\tlabel\ngood one\tpos\nno label here\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 3 has no value for column 'label'"):
        read_table(table, ["sentence", "label"])
    conll = tmp_path / "only-docstart.txt"
    conll.write_text("-DOCSTART- -X- -X- O\n\n", encoding="utf-8")
    with pytest.raises(InputError, match="no CoNLL sentences found"):
        read_conll2003(conll)


@pytest.mark.parametrize(
    ("scores", "fragment"),
    [
        (["1", "1", "1"], "every gold score in column 'score' is 1.0"),
        (["1", "nan", "2"], "row 2 has the gold score 'nan'"),
        (["1", "2", "inf"], "row 3 has the gold score 'inf'"),
    ],
)
def test_pairs_gold_scores_must_rank(tmp_path, tiny_encoder, scores, fragment):
    path = tmp_path / "pairs.tsv"
    rows = [f"a {i}\tb {i}\t{s}" for i, s in enumerate(scores)]
    path.write_text("sentence1\tsentence2\tscore\n" + "\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=fragment):
        lw.probe("pairs", data=path, encoder=tiny_encoder, controls=(), scalar_mix=False)


def test_nan_score_is_never_best_and_json_stays_strict(tmp_path):
    from layerwise._probing.result import ProbeResult, ProbeRow

    rows = [ProbeRow("L0", "layer", (0,), float("nan")), ProbeRow("L1", "layer", (1,), 0.4),
            ProbeRow("L2", "layer", (2,), 0.7), ProbeRow("L3", "layer", (3,), float("nan"))]  # fmt: skip
    result = ProbeResult("pairs", "Spearman", "m", rows, 0, 4, 0.1)
    assert result.best.name == "L2"
    result.to_json(tmp_path / "r.json")
    text = (tmp_path / "r.json").read_text()
    assert "NaN" not in text
    saved = json.loads(text)
    assert saved["rows"][0]["score"] is None and saved["rows"][2]["best"] is True
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(result.table())
    text = console.export_text()
    assert "n/a" in text and "L2 ◀ best" in text


def test_ner_table_shows_token_accuracy_and_names_the_selectivity_metric():
    from rich.console import Console

    from layerwise._probing.result import ProbeResult, ProbeRow

    row = ProbeRow("L0", "layer", (0,), score=0.515, accuracy=0.91, control_task=0.901)
    result = ProbeResult("conll:ner", "entity F1", "m", [row], 10, 5, 0.1)
    console = Console(record=True, width=160)
    console.print(result.table())
    text = console.export_text()
    assert "token accuracy" in text and "91.0" in text and "51.5" in text
    assert "selectivity (accuracy)" in text and "0.9" in text  # 91.0 - 90.1, not 51.5 - 90.1
    assert "not entity F1" in text
    assert result.to_dict()["selectivity_metric"] == "accuracy"


def test_cli_probe_refuses_unwritable_outputs_before_work(tmp_path, pos_files):
    from typer.testing import CliRunner

    from layerwise.cli import app

    train, dev = pos_files
    base = [
        "probe",
        "conllu",
        "--train",
        str(train),
        "--dev",
        str(dev),
        "--model",
        str(tmp_path / "no-model"),
    ]
    result = CliRunner().invoke(app, [*base, "--json", str(tmp_path / "missing" / "p.json")])
    assert (
        result.exit_code == 2
        and "folder" in result.output
        and "does not exist; create it first" in result.output
    )
    result = CliRunner().invoke(app, [*base, "--plot", str(tmp_path / "p.bmp")])
    assert result.exit_code == 2 and "use a .png, .svg or .pdf file" in result.output


def test_cli_probe_offers_the_subword_pools_of_names_py(tmp_path, pos_files):
    """--subword takes the library's SubwordPool values and refuses another before any work."""
    from typer.testing import CliRunner

    from layerwise._features.names import SUBWORD_POOLS
    from layerwise.cli import app

    train, dev = pos_files
    for task in ("conllu", "conll"):
        args = ["probe", task, "--train", str(train), "--dev", str(dev), "--subword", "median"]
        result = CliRunner().invoke(app, [*args, "--model", str(tmp_path / "no-model")])
        output = " ".join(result.output.split())
        assert result.exit_code == 2 and "'median' is not one of" in output
        assert all(f"'{pool}'" in output for pool in SUBWORD_POOLS)


def test_probe_conll_on_plain_text_names_the_line_and_one_class_is_refused(tmp_path, tiny_encoder):
    """Plain sentences given as CoNLL used to probe to accuracy 100.0 on every layer, "L0 ◀ best"."""
    from typer.testing import CliRunner

    from layerwise.cli import app

    small = tmp_path / "small.txt"
    small.write_text(
        "The cat sat on the mat.\nStocks fell sharply on Monday.\nA dog barked.\n", encoding="utf-8"
    )
    with pytest.raises(InputError, match=r"line 1 has 6 columns; CoNLL-2003 has 2 to 4"):
        read_conll2003(small)
    ragged = tmp_path / "ragged.conll"
    ragged.write_text("The O\ncat sat O\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"line 2 has 3 columns, line 1 has 2"):
        read_conll2003(ragged)
    result = CliRunner().invoke(app, ["probe", "conll", "--train", str(small), "--dev", str(small)])
    assert result.exit_code == 2 and "line 1 has 6 columns; CoNLL-2003 has 2 to 4" in result.output
    one_class = tmp_path / "o.conll"
    one_class.write_text(
        "The DT B-NP O\ncat NN I-NP O\n\nDogs NNS B-NP O\nbark VBP B-VP O\n", encoding="utf-8"
    )
    with pytest.raises(InputError, match=r"hold one class \('O' only"):
        lw.probe("conll", train=one_class, dev=one_class, encoder=tiny_encoder)
    table = tmp_path / "one.tsv"
    table.write_text("sentence\tlabel\na good one\tpos\nanother\tpos\n", encoding="utf-8")
    with pytest.raises(InputError, match="hold one class"):
        lw.probe("tsv", train=table, dev=table, encoder=tiny_encoder)
    assert read_conll2003(one_class, "pos").labels == [["DT", "NN"], ["NNS", "VBP"]]
