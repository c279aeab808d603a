"""Label-free layer metrics (Skean et al. 2025) against references written here with explicit loops
and numpy.linalg.eigvalsh of explicit Gram matrices, known answers, and the invariances the paper's
code lacks (batch size, input order)."""

from __future__ import annotations

import json
import math
import random
import sys

import numpy as np
import pytest
from conftest import REPO, needs_smollm2, ud_sentences

import layerwise as lw
from layerwise._analysis import augment, label_free, spectra
from layerwise.errors import InputError, OptionError

TEXTS = ud_sentences("dev", 40)


# ---------------------------------------------------------------------------------------------- references
def ref_normalise(rows: np.ndarray) -> np.ndarray:
    mean = [sum(rows[i][j] for i in range(len(rows))) / len(rows) for j in range(rows.shape[1])]
    out = np.array([[r[j] - mean[j] for j in range(len(mean))] for r in rows])
    return np.array([r / math.sqrt(sum(v * v for v in r)) for r in out])


def ref_entropy_of(rows: np.ndarray, alpha: float) -> float:
    """The paper's recipe spelled out: Gram (its d x d dual when n > d), clamp, trace, eigvalsh."""
    n, d = rows.shape
    vectors = rows.T if n > d else rows
    gram = np.array([[max(float(np.dot(a, b)), 0.0) for b in vectors] for a in vectors])
    eigenvalues = [e for e in np.linalg.eigvalsh(gram / np.trace(gram)) if e > 0]
    p = np.array(eigenvalues) / sum(eigenvalues)
    if alpha == 1:
        return -sum(x * math.log(x) for x in p)
    return math.log(sum(x**alpha for x in p)) / (1 - alpha)


def ref_prompt_entropy(stacks, alpha: float = 1.0) -> np.ndarray:
    out = []
    for s in range(stacks[0].hidden.shape[0]):
        values = []
        for stack in stacks:
            rows = stack.hidden[s].astype(np.float64)
            n, d = rows.shape
            if n < 2:
                continue  # one token has no spread: left out, as layerwise leaves it out
            values.append(ref_entropy_of(ref_normalise(rows), alpha) / min(math.log(n), math.log(d)))
        out.append(sum(values) / len(values))
    return np.array(out)


def ref_curvature(stacks) -> np.ndarray:
    out = []
    for s in range(stacks[0].hidden.shape[0]):
        per_text = []
        for stack in stacks:
            x = stack.hidden[s].astype(np.float64)
            if len(x) < 3:
                continue
            angles = []
            for k in range(1, len(x) - 1):
                a, b = x[k] - x[k - 1], x[k + 1] - x[k]
                cosine = abs(float(np.dot(a, b))) / (np.linalg.norm(a) * np.linalg.norm(b))
                angles.append(math.acos(min(cosine, 1.0)))
            per_text.append(sum(angles) / len(angles))
        out.append(sum(per_text) / len(per_text))
    return np.array(out)


def ref_two_nn(x: np.ndarray) -> float:
    x = [np.array(row) for row in sorted({tuple(row) for row in x.tolist()})]  # a repeated row counts once
    n = len(x)
    mus = []
    for i in range(n):
        distances = sorted(math.dist(x[i], x[j]) for j in range(n) if j != i)
        mus.append(distances[1] / distances[0])
    logs = sorted(math.log(m) for m in mus)[: int(n * 0.9)]
    y = [-math.log(1 - (i + 1) / n) for i in range(len(logs))]
    return sum(a * b for a, b in zip(logs, y, strict=True)) / sum(a * a for a in logs)


# ---------------------------------------------------------------------------------------------- known answers
def test_known_answers():
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.normal(size=(32, 32)))[0][:10]  # 10 orthonormal rows in 32 dimensions
    for alpha in (1.0, 2.0, 0.5):
        assert spectra.matrix_entropy(basis, alpha) == pytest.approx(math.log(10), abs=1e-12)
    # centred, 10 orthonormal rows have 9 equal eigenvalues (ln 9); their cosines are all -1/9, which
    # the paper's clamp sets to 0: the identity again (ln 10)
    centred = spectra.center_unit(basis)
    assert spectra.matrix_entropy(centred, clamp=False) == pytest.approx(math.log(9), abs=1e-12)
    assert spectra.matrix_entropy(centred) == pytest.approx(math.log(10), abs=1e-12)
    line = np.outer(np.sort(rng.normal(size=12)), rng.normal(size=16)) + rng.normal(size=16)
    assert spectra.curvature_of(line) == pytest.approx(0.0, abs=1e-7)
    # the paper's code centres and unit-scales tokens first: a straight line folds onto two points and
    # its curvature becomes rounding noise (why layerwise measures the states as they are)
    assert spectra.curvature_of(spectra.center_unit(line)) > 0.5
    square = np.array([[0, 0], [1, 0], [1, 1], [0, 1]], dtype=float)  # every turn a right angle
    assert spectra.curvature_of(square) == pytest.approx(math.pi / 2)
    plane = rng.uniform(size=(1500, 2)) @ rng.normal(size=(2, 10))  # a 2-d sheet in 10 dimensions
    assert spectra.two_nn(plane) == pytest.approx(2.0, abs=0.15)


def test_two_nn_and_entropy_match_the_loops():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 6))
    assert spectra.two_nn(x) == pytest.approx(ref_two_nn(x), rel=1e-9)
    for shape in ((12, 30), (50, 8)):  # the n x n Gram and the d x d dual, each with its clamp
        rows = spectra.center_unit(rng.normal(size=shape))
        for alpha in (1.0, 2.0):
            assert spectra.matrix_entropy(rows, alpha) == pytest.approx(ref_entropy_of(rows, alpha), abs=1e-9)


# ---------------------------------------------------------------------------------------------- real models
def _check_one_pass(stacks):
    np.testing.assert_allclose(lw.analyze.prompt_entropy(stacks), ref_prompt_entropy(stacks), atol=1e-6)
    np.testing.assert_allclose(
        lw.analyze.prompt_entropy(stacks, alpha=2, normalized=False),
        [
            np.mean([ref_entropy_of(ref_normalise(s.hidden[k].astype(np.float64)), 2.0) for s in stacks
                     if s.n_tokens >= 2])
            for k in range(stacks[0].hidden.shape[0])
        ],
        atol=1e-6,
    )  # fmt: skip
    np.testing.assert_allclose(lw.analyze.curvature(stacks), ref_curvature(stacks), atol=1e-6)
    dims = [
        np.mean(
            [ref_two_nn(ref_normalise(s.hidden[k].astype(np.float64))) for s in stacks if s.n_tokens >= 4]
        )
        for k in range(stacks[0].hidden.shape[0])
    ]
    np.testing.assert_allclose(lw.analyze.intrinsic_dimension(stacks), dims, atol=1e-6)
    means = np.array([[s.hidden[k].astype(np.float64).mean(axis=0) for k in range(s.hidden.shape[0])]
                      for s in stacks])  # fmt: skip
    n, states, d = means.shape
    expected_entropy, expected_rank = [], []
    for k in range(states):
        rows = ref_normalise(means[:, k])
        expected_entropy.append(ref_entropy_of(rows, 1.0) / min(math.log(n), math.log(d)))
        sigma = np.linalg.svd(means[:, k], compute_uv=False)
        p = sigma / sigma.sum() + 1e-7
        expected_rank.append(math.exp(-sum(x * math.log(x) for x in p)))
    np.testing.assert_allclose(lw.analyze.dataset_entropy(stacks), expected_entropy, atol=1e-6)
    np.testing.assert_allclose(lw.analyze.effective_rank(stacks), expected_rank, rtol=1e-6)


def test_one_pass_metrics_match_the_references_on_the_default_model(default_encoder):
    _check_one_pass(default_encoder.extract(TEXTS[:12], layers="all"))


@needs_smollm2
def test_one_pass_metrics_match_the_references_on_smollm2(smollm2):
    _check_one_pass(smollm2.extract(TEXTS[:6], layers="all"))


def test_view_metrics_match_the_references(default_encoder):
    texts = TEXTS[:10]
    means = augment.view_means(default_encoder, texts, views=3, seed=5)
    ordered = sorted(texts)
    for i, text in enumerate(ordered):  # each view is the mean of its augmented copy's tokens
        copy = augment.augment(text, seed=5, view=2)
        assert copy != text
        expected = default_encoder.extract(copy, layers="all").hidden.mean(axis=1)
        np.testing.assert_allclose(means[i, 2], expected, atol=1e-5)
    n, v, states, d = means.shape
    lidar, dime, infonce = [], [], []
    for k in range(states):
        z = ref_normalise(means[:, :, k].reshape(n * v, d).astype(np.float64)).reshape(n, v, d)
        class_means = z.mean(axis=1)
        grand = z.reshape(-1, d).mean(axis=0)
        between = sum(np.outer(m - grand, m - grand) for m in class_means) / n
        within = sum(np.outer(z[i, j] - class_means[i], z[i, j] - class_means[i]) for i in range(n)
                     for j in range(v)) / (n * v) + 1e-4 * np.eye(d)  # fmt: skip
        eigenvalues, vectors = np.linalg.eigh(within)
        root = vectors @ np.diag(eigenvalues**-0.5) @ vectors.T
        lda = np.linalg.eigvalsh(root @ between @ root)
        p = lda[lda > 0] / lda[lda > 0].sum()
        lidar.append(-sum(x * math.log(x) for x in p) / min(math.log(n), math.log(d)))
        # DiME and InfoNCE on the first two views, centred over those two
        z2 = ref_normalise(means[:, :2, k].reshape(2 * n, d).astype(np.float64)).reshape(n, 2, d)
        a, b = z2[:, 0], z2[:, 1]

        def h(joint):
            e = np.linalg.eigvalsh(joint / np.trace(joint))
            e = e[e > 0] / e[e > 0].sum()
            return -sum(x * math.log(x) for x in e)

        ka, kb = a @ a.T, b @ b.T
        perms = [np.random.default_rng([7, t]).permutation(n) for t in range(4)]
        shuffled = sum(h(ka * kb[p][:, p]) for p in perms) / 4
        dime.append((shuffled - h(ka * kb)) / min(math.log(n), math.log(d)))
        z_all = list(a) + list(b)
        losses = []
        for i in range(2 * n):
            pos = math.exp(float(z_all[i] @ z_all[(i + n) % (2 * n)]) / 0.1)
            neg = sum(math.exp(float(z_all[i] @ z_all[j]) / 0.1) for j in range(2 * n) if j % n != i % n)
            losses.append(-math.log(pos / (pos + neg)))
        infonce.append(sum(losses) / len(losses))
    np.testing.assert_allclose(augment.lidar_of(means), lidar, atol=1e-6)
    np.testing.assert_allclose(augment.dime_of(means, permutations=4, seed=7), dime, atol=1e-6)
    np.testing.assert_allclose(augment.infonce_of(means), infonce, atol=1e-6)


# ---------------------------------------------------------------------------------------------- invariances
def test_values_do_not_depend_on_batch_size_or_order(default_encoder):
    texts = TEXTS[:24]
    shuffled = texts[:]
    random.Random(3).shuffle(shuffled)
    runs = [
        lw.analyze.layer_metrics(default_encoder, order, views=3, batch_size=size)
        for size, order in ((1, texts), (7, texts), (32, texts), (32, shuffled))
    ]
    assert set(runs[0].values) == set(label_free.METRICS)
    for run in runs[1:]:
        for name, values in runs[0].values.items():
            np.testing.assert_allclose(run.values[name], values, rtol=1e-5, atol=1e-6, err_msg=name)


def test_sources_agree_and_wrong_ones_are_refused(default_encoder, tmp_path):
    texts = TEXTS[:8]
    stacks = default_encoder.extract(texts, layers="all")
    from_stacks = lw.analyze.layer_metrics(stacks)
    store = lw.extract_to_store(
        default_encoder, texts, tmp_path / "t.lw", lw.OutputPlan.parse(dtype="float32")
    )
    from_store = lw.analyze.layer_metrics(lw.open_store(store.path))
    assert from_store.layers == from_stacks.layers == tuple(range(7)) and from_store.n_texts == 8
    for name in label_free.ONE_PASS_METRICS:
        np.testing.assert_allclose(from_store.values[name], from_stacks.values[name], atol=1e-6)
    table = from_stacks.as_dict()
    assert table["best"]["prompt_entropy"] == 1 + int(np.argmin(from_stacks.values["prompt_entropy"][1:]))
    assert table["best"]["effective_rank"] == 1 + int(np.argmax(from_stacks.values["effective_rank"][1:]))

    pooled = lw.extract_to_store(default_encoder, texts, tmp_path / "s.lw", lw.OutputPlan.parse(pool="mean"))
    with pytest.raises(InputError, match="a sentence-level store holds no token vectors"):
        lw.analyze.layer_metrics(lw.open_store(pooled.path))
    with pytest.raises(OptionError, match=r"lidar compare augmented views .* pass an Encoder and texts"):
        lw.analyze.layer_metrics(stacks, metrics=["lidar"])
    with pytest.raises(OptionError, match="unknown metric 'entropy'; choose from prompt_entropy"):
        lw.analyze.layer_metrics(stacks, metrics=["entropy"])
    with pytest.raises(OptionError, match="an Encoder source needs texts"):
        lw.analyze.layer_metrics(default_encoder)


def test_augmentations_are_seeded_and_positionless():
    text = "the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat"
    views = [augment.augment(text, seed=0, view=v) for v in range(6)]
    assert views == [augment.augment(text, seed=0, view=v) for v in range(6)]
    assert len(set(views)) == 6 and text not in views
    assert augment.augment("word", seed=0, view=0) != "word" and augment.augment("", seed=0, view=0) == ""
    assert augment.augment(text, seed=1, view=0) != views[0]


# ---------------------------------------------------------------------------------------------- the answer
def _rule_table() -> dict:
    """A rule table as benchmarks/label_free_layers.py writes it, small enough to check by hand."""

    def stats(mean, worst):
        return {"mean": mean, "worst": worst, "cases": 4}

    return {
        "version": 2,
        "cases": 12,
        "groups": {
            "decoder/mean": {
                "ranked": ["dime", "effective_rank", "middle (L/2)", "last (L)"],
                "rules": {"dime": stats(0.5, 2.0), "effective_rank": stats(1.5, 4.0),
                          "middle (L/2)": stats(2.5, 6.0), "last (L)": stats(9.0, 21.0)},
                "cases": 4, "spread": 0.25, "held_out": {"mean": 2.2, "worst": 7.5, "cases": 4},
            },
            "encoder/mean": {
                "ranked": ["last (L)", "middle (L/2)"],
                "rules": {"last (L)": stats(0.4, 3.0), "middle (L/2)": stats(5.0, 9.0)},
                "cases": 4, "spread": 0.1, "held_out": {"mean": 0.6, "worst": 3.8, "cases": 4},
            },
        },
        "held_out": {"encoder": {"mean": 0.7, "worst": 3.9, "cases": 8},
                     "decoder": {"mean": 2.5, "worst": 8.0, "cases": 6}},
    }  # fmt: skip


def test_the_recommendation_follows_the_best_measured_rule_of_its_group(monkeypatch):
    from layerwise._analysis import layer_choice

    values = {
        "effective_rank": np.array([0.9, 0.5, 0.2, 0.4, 0.6]),
        "dime": np.array([0.0, 0.1, 0.2, 0.5, 0.3]),
    }
    metrics = label_free.LayerMetrics((0, 1, 2, 3, 4), values, n_texts=10)
    monkeypatch.setattr(layer_choice, "benchmark_rules", _rule_table)
    choice = layer_choice.recommend(metrics, kind="decoder")
    assert (choice.layer, choice.rule, choice.group) == (3, "dime", "decoder/mean")  # dime's highest past 0
    assert str(choice).startswith("Try hidden state 3 first: the layer with the highest dime.")
    assert "0.5 points below the best layer on average (worst 2.0)" in choice.reason
    assert (
        "was 2.2 points below the best on average (worst 7.5, 4 cases; all decoder cases: 2.5, worst 8.0)"
        in (choice.reason)
    )
    # candidates: dime -> 3; effective rank -> 4 (its highest past the embeddings); middle -> 2; last -> 4
    assert [(c.layer, [r for r, _, _ in c.rules]) for c in choice.candidates] == [
        (3, ["dime"]), (4, ["effective_rank", "last (L)"]), (2, ["middle (L/2)"])]  # fmt: skip
    assert choice.agree  # 3 and 4 are 1/4 of the depth apart: within the spread of 0.25
    assert "hidden state 4: the layer with the highest effective rank (1.5 points on average, worst 4.0)" in (
        choice.candidates_text()
    )
    # the same metrics for an encoder: its own group's first rule
    encoder_choice = layer_choice.recommend(metrics, kind="encoder")
    assert (encoder_choice.layer, encoder_choice.rule) == (4, "last (L)")
    assert (
        not encoder_choice.agree
        and "more than the benchmark's spread (10% of the depth)" in encoder_choice.reason
    )
    # without the view metrics, the next rule of the group that applies
    one_pass = label_free.LayerMetrics((0, 1, 2, 3, 4), {"effective_rank": values["effective_rank"]}, 10)
    assert layer_choice.recommend(one_pass, kind="decoder").rule == "effective_rank"
    # a pooling the benchmark has no cases of for the kind: the kind's mean-pooled group, said so
    fallback = layer_choice.recommend(metrics, kind="encoder", use="last")
    assert fallback.group == "encoder/mean" and "no last cases for encoders" in fallback.reason
    as_json = choice.as_dict()
    assert as_json["rule_table_version"] == 2 and as_json["held_out"]["worst"] == 7.5
    assert as_json["candidates"][1] == {"layer": 4, "rules": [
        {"rule": "effective_rank", "mean_regret": 1.5, "worst_regret": 4.0},
        {"rule": "last (L)", "mean_regret": 9.0, "worst_regret": 21.0}]}  # fmt: skip


def test_fixed_rules_and_pool_names():
    from layerwise._analysis import layer_choice
    from layerwise.errors import OptionError

    assert [layer_choice.fixed_layer(rule, 30) for rule in layer_choice.FIXED_RULES] == [1, 8, 15, 22, 30]
    assert [layer_choice.fixed_layer(rule, 3) for rule in layer_choice.FIXED_RULES] == [1, 1, 2, 2, 3]
    uses = [layer_choice.use_of_pool(p) for p in ("sentence:mean", "sentence:last", "token", "word:first")]
    assert uses == ["mean", "last", "token", "token"]
    with pytest.raises(OptionError, match=r"sentence:max.*measured for sentence:mean"):
        layer_choice.use_of_pool("sentence:max")


def test_the_shipped_rules_are_the_benchmarks_own():
    """The shipped table is what re-scoring the recorded per-layer scores gives, and it judged its
    rules on at least 24 cases of real models, encoders and decoders, by leave-one-model-out."""
    import importlib

    from layerwise._analysis import layer_choice

    sys.path.insert(0, str(REPO / "benchmarks"))
    bench = importlib.import_module("label_free_layers")
    recorded = json.loads((REPO / "benchmarks" / "results" / "label_free_layers.json").read_text())
    cases = bench.cases_of(recorded["models"])
    shipped = layer_choice.benchmark_rules()
    assert shipped == bench.rule_table(recorded["models"], cases, bench.held_out(cases))
    assert shipped["cases"] >= 24 and set(shipped["held_out"]) == {"encoder", "decoder"}
    assert {kind for kind in shipped["models"].values()} == {"encoder", "decoder"}
    for group in shipped["groups"].values():
        regrets = [group["rules"][rule]["mean"] for rule in group["ranked"]]
        assert regrets == sorted(regrets) and set(group["ranked"]) <= set(layer_choice.RULES)
    # the targets, on the recorded cases: held out, mean <= 3 and worst <= 10 points per kind
    assert all(f["mean"] <= 3 and f["worst"] <= 10 for f in shipped["held_out"].values())
    # and SmolLM2's mean-pooled similarity: the first candidate within 5 points of the best layer
    smollm2 = layer_choice.LayerMetrics.from_dict(recorded["models"]["SmolLM2-135M-Instruct"]["metrics"])
    first = layer_choice.recommend(smollm2, kind="decoder", use="mean").layer
    scores = recorded["models"]["SmolLM2-135M-Instruct"]["tasks"]["similarity"]["mean"]
    assert 100 * (max(scores[1:]) - scores[first]) <= 5


def test_layers_command(tmp_path, tiny_encoder):
    from typer.testing import CliRunner

    from layerwise._analysis.layer_choice import recommend
    from layerwise.cli import app

    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS[:12]) + "\n", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["layers", str(source), "--model", tiny_encoder.source, "--views", "2",
                                 "--json", str(tmp_path / "l.json"), "--quiet"])  # fmt: skip
    assert result.exit_code == 0, result.output
    table = json.loads((tmp_path / "l.json").read_text())
    expected = recommend(lw.analyze.layer_metrics(tiny_encoder, TEXTS[:12], views=2))
    assert (
        table["recommendation"]["layer"] == expected.layer
        and f"Try hidden state {expected.layer} first" in result.output
    )
    assert table["recommendation"] == expected.as_dict() and table["made"]["pool"] == "sentence:mean"
    assert table["recommendation"]["rule_table_version"] == 2 and table["recommendation"]["candidates"]
    assert table["recommendation"]["held_out"]["cases"] >= 12
    if len(expected.candidates) > 1:
        assert "Candidates, each with the rules that pick it" in result.output
    bad_pool = runner.invoke(
        app, ["layers", str(source), "--model", tiny_encoder.source, "--pool", "sentence:max"]
    )
    assert bad_pool.exit_code == 2 and "measured for sentence:mean" in bad_pool.output
    assert set(table["metrics"]) == set(label_free.METRICS) and table["layers"] == [0, 1, 2, 3]
    assert "hidden state" in result.output and "(higher)" in result.output
    refused = runner.invoke(app, ["layers", str(source), "--model", tiny_encoder.source, "--views", "1"])
    assert refused.exit_code == 2 and "--views 1 compares nothing" in refused.output


def test_texts_too_short_for_a_metric_leave_it_empty_not_an_error(tmp_path, tiny_encoder):
    from typer.testing import CliRunner

    from layerwise.cli import app

    metrics = lw.analyze.layer_metrics(tiny_encoder.extract(["a", "b", "c", "d"], layers="all"))
    assert np.isnan(metrics.values["intrinsic_dimension"]).all()  # 3 tokens each: TwoNN needs 4
    assert metrics.picks()["intrinsic_dimension"] is None and metrics.as_dict()["best"]["curvature"] in (
        1,
        2,
        3,
    )
    source = tmp_path / "short.txt"
    source.write_text("a\nb\nc\nd\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["layers", str(source), "--model", tiny_encoder.source, "--quiet"])
    assert result.exit_code == 0 and "Try hidden state" in result.output, result.output


def test_long_texts_measure_their_states_a_few_at_a_time(default_encoder, monkeypatch):
    stacks = default_encoder.extract(TEXTS[:4], layers="all")
    whole = lw.analyze.intrinsic_dimension(stacks)
    monkeypatch.setattr(label_free, "_DISTANCE_BYTES", 1)  # one state's distances at a time
    np.testing.assert_array_equal(lw.analyze.intrinsic_dimension(stacks), whole)


def test_layers_reads_any_corpus(tmp_path, tiny_encoder):
    from typer.testing import CliRunner

    from layerwise.cli import app

    corpus = REPO / "examples" / "corpus.parquet"
    runner = CliRunner()
    options = ["--text-column", "text", "--max-texts", "5", "--json", str(tmp_path / "p.json"), "--quiet"]
    result = runner.invoke(app, ["layers", str(corpus), "--model", tiny_encoder.source, *options])
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "p.json").read_text())
    assert written["n_texts"] == 5 and written["made"]["source"] == str(corpus)
    # as every output records it: an encoder has no final norm (#55, 21)
    assert written["made"]["settings"] == {
        **lw.Encoder(tiny_encoder.source).settings.as_dict(),
        "final_norm": None,
    }
    piped = runner.invoke(app, ["layers", "-", "--format", "txt", "--model", tiny_encoder.source, "--quiet"],
                          input="one text here\nand another one\n")  # fmt: skip
    assert piped.exit_code == 0 and "Try hidden state" in piped.output, piped.output
    missing = runner.invoke(
        app, ["layers", str(corpus), "--text-column", "nope", "--model", tiny_encoder.source]
    )
    assert missing.exit_code == 2 and "no column 'nope'" in missing.output
    nowhere = runner.invoke(app, ["layers", str(corpus), "--json", str(tmp_path / "no" / "l.json")])
    assert nowhere.exit_code == 2 and "does not exist; create it first" in nowhere.output
    assert "loading" not in nowhere.output  # refused before the model is loaded


def test_how_an_encoder_reads_its_texts_is_named_once_and_reaches_iter_extract(tiny_encoder):
    # the metrics take TokenPassOptions (analysis/sources.py), not a **kwargs pass-through: each of
    # its keys is a keyword of Encoder.iter_extract, and one of them reaches it
    import inspect

    from layerwise._analysis.sources import TokenPassOptions

    parameters = inspect.signature(type(tiny_encoder).iter_extract).parameters
    assert set(TokenPassOptions.__annotations__) <= set(parameters)
    assert {"layers", "dtype", "taps"}.isdisjoint(TokenPassOptions.__annotations__)  # every state, float32
    texts = ["one two three four five six seven", "the cat sat on the mat today"]
    seen = []

    class Spy:  # an Encoder source that records what it was asked
        def iter_extract(self, texts, **options):
            seen.append(options)
            return tiny_encoder.iter_extract(texts, **options)

    got = lw.analyze.curvature(Spy(), texts, long_texts="window", stride=2, batch_size=1, progress=False)
    asked = {"long_texts": "window", "stride": 2, "batch_size": 1, "progress": False}
    assert seen == [{"layers": "all", **asked}]
    whole = tiny_encoder.extract(texts, layers="all")  # short texts: windows change nothing
    np.testing.assert_allclose(got, lw.analyze.curvature(whole), atol=1e-6)


def test_identical_texts_and_undefined_metrics_pick_no_layer_with_a_warning(tiny_encoder, caplog):
    """Five identical lines gave a `*` pick on intrinsic dimension, NaN dataset entropy, no warning."""
    import logging

    with caplog.at_level(logging.WARNING, logger="layerwise"):
        same = lw.analyze.layer_metrics(tiny_encoder, ["The cat sat on the mat."] * 5, metrics="one-pass")
    assert same.n_distinct == 1 and set(same.picks().values()) == {None}
    assert "1 distinct text(s) among 5: too few to pick a layer" in caplog.text
    texts = [
        f"sentence number {i} is about {w}" for i, w in enumerate(["cats", "dogs", "stocks", "rain", "tea"])
    ]
    varied = lw.analyze.layer_metrics(tiny_encoder, texts, metrics="one-pass")
    assert varied.n_distinct == 5 and varied.picks()["intrinsic_dimension"] is not None
    values = dict(varied.values)
    values["curvature"] = values["curvature"].copy()
    values["curvature"][2] = np.nan  # undefined at one layer: it cannot rank that layer
    nan_table = label_free.LayerMetrics(varied.layers, values, 5, 5)
    assert nan_table.picks()["curvature"] is None
    assert any("curvature is undefined (NaN) at hidden state(s) [2]" in w for w in nan_table.warnings())
    assert label_free.LayerMetrics.from_dict(same.as_dict()).n_distinct == 1
    from layerwise._analysis import layer_choice

    assert "0% of the depth" not in layer_choice.recommend(same).reason
