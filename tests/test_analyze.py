"""Known answers for the layer statistics, the report, and a look at it in headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

import layerwise as lw
from layerwise._analysis.label_free import ONE_PASS_METRICS
from layerwise._analysis.stats import linear_cka

RNG = np.random.default_rng(0)


def test_cka_known_answers():
    x = RNG.normal(size=(500, 20))
    assert linear_cka(x, x) == pytest.approx(1.0)
    q, _ = np.linalg.qr(RNG.normal(size=(20, 20)))
    assert linear_cka(x, 3.7 * x @ q) == pytest.approx(1.0)  # orthogonal transform and isotropic scaling
    assert linear_cka(x, x + 5.0) == pytest.approx(1.0)  # centring removes offsets
    independent = RNG.normal(size=(2000, 20))
    assert linear_cka(RNG.normal(size=(2000, 20)), independent) < 0.05
    assert linear_cka(x, x[:, :10]) < 1.0  # losing dimensions is not invariant


def test_anisotropy_of_isotropic_gaussian_is_near_zero():
    vectors = RNG.normal(size=(5000, 3, 64))  # (rows, layers, dim)
    assert np.abs(lw.analyze.anisotropy(vectors)).max() < 0.02
    shifted = vectors + 3.0  # a common direction makes every pair similar
    assert lw.analyze.anisotropy(shifted).min() > 0.8


def test_layer_similarity_and_drift_on_stacks(tiny_encoder):
    stacks = tiny_encoder.extract(["The bank raised rates.", "We sat on the river bank.", "Hi there"])
    for measure in ("cka", "cosine"):
        sim = lw.analyze.layer_similarity(stacks, measure=measure)
        assert sim.shape == (4, 4)
        np.testing.assert_allclose(np.diag(sim), 1.0)
        np.testing.assert_allclose(sim, sim.T)
    moves = lw.analyze.drift(stacks)
    tokens = np.concatenate([s.hidden for s in stacks], axis=1).astype(np.float64)
    np.testing.assert_allclose(moves["distance"][0], np.linalg.norm(tokens[1] - tokens[0], axis=-1).mean())
    assert moves["layers"].tolist() == [1, 2, 3]


def test_self_similarity_is_one_for_identical_contexts(tiny_encoder):
    stacks = tiny_encoder.extract(["the bank raised rates"] * 3 + ["a river bank", "bank"])
    same = lw.analyze.self_similarity(stacks[:3], ["bank", "rates", "absent"], adjust=False)
    np.testing.assert_allclose(same["bank"], 1.0, atol=1e-6)
    np.testing.assert_allclose(same["rates"], 1.0, atol=1e-6)
    assert np.isnan(same["absent"]).all()
    varied = lw.analyze.self_similarity(stacks, ["bank"], adjust=False)["bank"]
    assert (varied < 1 - 1e-6).all()  # other contexts (and positions) move the vectors apart
    adjusted = lw.analyze.self_similarity(stacks, ["bank"])["bank"]
    words = [lw.pool_words(s, "mean") for s in stacks]  # the baseline: random pairs of words
    np.testing.assert_allclose(adjusted, varied - lw.analyze.anisotropy(words), atol=1e-9)


def test_intra_sentence_similarity(tiny_encoder):
    stacks = tiny_encoder.extract(["one two three four", "five six seven"])
    raw = lw.analyze.intra_sentence_similarity(stacks, adjust=False)
    assert raw.shape == (4,) and ((raw > 0) & (raw <= 1)).all()


def test_statistics_on_a_store_match_memory(tmp_path, tiny_encoder):
    texts = ["The bank raised rates.", "We sat on the river bank.", "Hi there, friend."]
    lw.extract_to_store(tiny_encoder, texts, tmp_path / "c.lw", lw.OutputPlan.parse(dtype="float32"))
    store = lw.open_store(tmp_path / "c.lw")
    from_store = lw.analyze.layer_similarity(store)
    from_memory = lw.analyze.layer_similarity(tiny_encoder.extract(texts))
    np.testing.assert_allclose(from_store, from_memory, atol=1e-9)


REPORT_TEXTS = [
    "The bank raised interest rates again.",
    "We sat on the river bank all afternoon.",
    "The bank approved the loan quickly.",
    "A crane lifted the steel beam.",
    "The crane stood still in the water.",
    "Birds like the crane live near the bank of the river.",
]


@pytest.fixture(scope="module")
def report(tmp_path_factory, make_tiny_model):
    enc = lw.Encoder(make_tiny_model("bert"), device="cpu")
    folder = tmp_path_factory.mktemp("report")
    from layerwise._analysis.report import write_report

    stacks = enc.extract(REPORT_TEXTS, long_texts="window", progress=False)
    return write_report(stacks, folder, model=enc.name, max_length=enc.max_length, words=["bank", "crane"])


def test_report_embeds_figures_and_tables(report):
    html = report.read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") >= 6
    for heading in ("Linear CKA", "Anisotropy", "Self-similarity", "Settings"):
        assert heading in html
    assert html.count("<table>") >= 3 and "<td>bank</td>" in html
    assert (report.parent / "stats.json").exists() and (report.parent / "projection.png").exists()
    assert 'src="http' not in html  # self-contained
    # the label-free section: a figure per metric with its pick, the table, the layer to try first
    stats = json.loads((report.parent / "stats.json").read_text(encoding="utf-8"))
    label_free = stats["label_free"]
    assert set(label_free["metrics"]) == set(ONE_PASS_METRICS)
    assert "Which layer, without labels?" in html and "Try hidden state " in html
    for name, best in label_free["best"].items():
        assert (report.parent / f"{name}.png").exists() and 1 <= best <= 3


def test_report_renders_in_headless_chromium(report, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it")
    shot = tmp_path / "report.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", "--window-size=1100,2400"]  # fmt: skip
    flags.append(f"--user-data-dir={tmp_path / 'profile'}")
    run = subprocess.run([browser, *flags, f"--screenshot={shot}", report.as_uri()], timeout=120,
                         capture_output=True, text=True)  # fmt: skip
    if run.returncode != 0 or not shot.exists():
        pytest.skip(f"Chromium could not run here (exit {run.returncode}): {run.stderr[-300:]}")
    from PIL import Image

    image = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert image.shape[0] >= 2000
    # a rendered page with figures: plenty of non-white pixels, not a blank or error page
    assert (image < 200).mean() > 0.01


def test_cli_analyze_and_plot(tmp_path, make_tiny_model):
    from typer.testing import CliRunner

    from layerwise.cli import app

    source = tmp_path / "t.txt"
    source.write_text("\n".join(REPORT_TEXTS) + "\n", encoding="utf-8")
    model = str(make_tiny_model("bert"))
    runner = CliRunner()
    result = runner.invoke(app, ["analyze", str(source), "-o", str(tmp_path / "r"), "--model", model, "-q"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "report.html").exists()
    result = runner.invoke(app, ["plot", str(source), "--words", "bank,crane", "-o", str(tmp_path / "p.png"),
                                 "--model", model])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    result = runner.invoke(app, ["plot", str(source), "--words", "zebra", "-o", str(tmp_path / "z.png"),
                                 "--model", model])  # fmt: skip
    assert result.exit_code == 2 and "found 0 occurrences" in " ".join(result.output.split())


@pytest.mark.parametrize("method", ["pca", "tsne"])
def test_projection_grid(tmp_path, method):
    from layerwise._analysis.plot import plot_projections, project

    vectors = np.concatenate([RNG.normal(size=(3, 10, 8)), RNG.normal(size=(3, 10, 8)) + 6], axis=1)
    labels = ["a"] * 10 + ["b"] * 10
    xy = project(vectors[0], method)
    assert xy.shape == (20, 2)
    # two well-separated clouds stay apart in 2-D: nearest neighbours share the label
    d = np.linalg.norm(xy[:, None] - xy[None], axis=-1) + np.eye(20) * 1e9
    assert (np.array(labels)[d.argmin(1)] == np.array(labels)).all()
    path = plot_projections(vectors, labels, (0, 1, 2), tmp_path / "p.png", projection=method)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_umap_without_the_package_says_how_to_install():
    from layerwise._analysis.plot import project
    from layerwise.errors import MissingDependencyError

    try:
        import umap  # noqa: F401
    except ImportError:
        with pytest.raises(MissingDependencyError, match="pip install umap-learn"):
            project(RNG.normal(size=(10, 4)), "umap")
    else:
        assert project(RNG.normal(size=(10, 4)), "umap").shape == (10, 2)


def test_cli_checks_outputs_and_projection_before_extracting(tmp_path, make_tiny_model, monkeypatch):
    from typer.testing import CliRunner

    import layerwise._encoder
    from layerwise.cli import app

    source = tmp_path / "t.txt"
    source.write_text("\n".join(REPORT_TEXTS) + "\n", encoding="utf-8")
    model = str(make_tiny_model("bert"))

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")

    runner = CliRunner()
    (tmp_path / "a-file").write_text("x")
    with monkeypatch.context() as patch:
        patch.setattr(layerwise._encoder.Encoder, "__init__", no_model)
        cases = [
            (
                ["analyze", str(source), "-o", str(tmp_path / "a-file")],
                "is a file; the report needs a folder",
            ),
            (
                ["plot", str(source), "--words", "bank", "-o", str(tmp_path / "x.bmp")],
                "use a .png, .svg or .pdf",
            ),
            (
                ["plot", str(source), "--words", "bank", "-o", str(tmp_path / "no" / "x.png")],
                "does not exist",
            ),
            (["analyze", str(source), "-o", str(tmp_path / "r"), "--projection", "umap"], "needs umap-learn"),
        ]
        for args, message in cases:
            result = runner.invoke(app, [*args, "--model", model])
            assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    # user text with "$" is drawn as text, not parsed as matplotlib math
    args = ["plot", str(source), "--words", "$^$,bank,crane", "-o", str(tmp_path / "d.png"), "--model", model]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output


def _words(vectors: np.ndarray) -> lw.WordVectors:
    n = vectors.shape[1]
    return lw.WordVectors(
        vectors=vectors, layers=tuple(range(vectors.shape[0])), words=tuple(f"w{i}" for i in range(n)),
        spans=np.zeros((n, 2), np.int32), segment_ids=np.zeros(n, np.int32), n_subwords=np.ones(n, np.int32),
        text=" ".join(f"w{i}" for i in range(n)),
    )  # fmt: skip


def test_intra_sentence_similarity_known_answers():
    """Written out: per sentence, the mean over its words of cos(word, the sentence's mean word);
    the mean over sentences; minus the anisotropy (the mean cosine of distinct rows)."""
    rng = np.random.default_rng(3)
    sentences = [rng.normal(size=(2, n, 5)) for n in (3, 4, 2)]
    expected = np.zeros(2)
    for v in sentences:
        for layer in range(2):
            centre = v[layer].mean(axis=0)
            cosines = [w @ centre / np.linalg.norm(w) / np.linalg.norm(centre) for w in v[layer]]
            expected[layer] += np.mean(cosines) / len(sentences)
    got = lw.analyze.intra_sentence_similarity([_words(v) for v in sentences], adjust=False)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    # four rows with every pair at cosine c: the anisotropy is c whichever pairs are drawn, and a
    # sentence of two of them has cos(word, mean) = sqrt((1 + c) / 2) for both words
    t = 0.5
    rows = np.eye(4) + t  # pairwise cosine (2t + 4t^2) / (1 + 2t + 4t^2)
    c = (2 * t + 4 * t * t) / (1 + 2 * t + 4 * t * t)
    items = [_words(np.stack([rows[:2]] * 3)), _words(np.stack([rows[2:]] * 3))]
    np.testing.assert_allclose(lw.analyze.anisotropy(items), [c] * 3, rtol=1e-12)
    adjusted = lw.analyze.intra_sentence_similarity(items)
    np.testing.assert_allclose(adjusted, [np.sqrt((1 + c) / 2) - c] * 3, rtol=1e-12)
