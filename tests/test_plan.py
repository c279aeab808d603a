"""OutputPlan: one parser and validator; the same results as the Encoder's own calls."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import layerwise as lw
from layerwise.errors import OptionError

TEXTS = ["The bank raised rates.", "We sat on the river bank.", ""]


def test_parse_string_forms():
    plan = lw.OutputPlan.parse(layers="last4", pool="sentence:mean", fuse="concat")
    assert (plan.level, plan.mode, plan.fuse, plan.pool) == ("sentence", "mean", "concat", "sentence:mean")
    assert plan.hidden_states(7) == (3, 4, 5, 6)
    named = lw.OutputPlan.parse(layers="all", pool="word:first", fuse="concat_last4")  # CLI default layers
    assert named.layers is None and named.hidden_states(13) == (9, 10, 11, 12)
    assert named.row_shape(384, 13) == (4 * 384,)
    assert lw.OutputPlan.parse(pool="word:first_last").row_shape(32, 4) == (4, 64)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pool": "token", "fuse": "last"}, "needs word or sentence pooling"),
        ({"pool": "word:avg"}, "pool 'word:avg' is not valid; choose one of token, word:first"),
        ({"pool": "token:mean"}, "pool 'token:mean' is not valid"),
        ({"pool": "sentence"}, "pool 'sentence' is not valid"),
        ({"pool": "sentence:mean", "fuse": "concat_last4", "layers": [1, 2]}, "uses its own hidden states"),
        ({"pool": "sentence:mean", "fuse": "median"}, "fuse='median' is not valid"),
        ({"dtype": "int8"}, "dtype='int8' is not valid"),
        ({"special_tokens": "some"}, "special_tokens='some' is not valid"),
    ],
)
def test_one_validator(options, message):
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        lw.OutputPlan.parse(**options)


def test_apply_equals_the_encoder_calls(tiny_encoder):
    stream = tiny_encoder.iter_extract(TEXTS, layers="all")
    plan = lw.OutputPlan.parse(pool="sentence:max", fuse="mean_last4")
    got = dict(plan.apply(stream, n_hidden_states=tiny_encoder.n_hidden_states))
    expected = tiny_encoder.embed(TEXTS, pool="max", fuse="mean_last4")
    np.testing.assert_array_equal(np.stack([got[i].vector for i in range(3)]), expected)
    words_plan = lw.OutputPlan.parse(pool="word:mean", layers=[0, -1])
    stream = tiny_encoder.iter_extract(TEXTS, layers=words_plan.hidden_states(4))
    words = dict(words_plan.apply(stream, n_hidden_states=4))
    exact = tiny_encoder.embed_words(TEXTS, subword="mean", layers=[0, -1])
    for i in range(3):
        np.testing.assert_array_equal(words[i].vectors, exact[i].vectors)


def test_extract_to_file_writes_what_the_plan_says(tmp_path, tiny_encoder):
    plan = lw.OutputPlan.parse(pool="sentence:mean", layers=[1, -1], dtype="float16")
    summary = lw.extract_to_file(tiny_encoder, TEXTS, tmp_path / "s.npz", plan)
    assert summary["n_texts"] == 3
    z = np.load(tmp_path / "s.npz")
    meta = json.loads(str(z["meta"]))
    assert meta["layers"] == [1, 3] and meta["pool"] == "sentence:mean" and meta["dtype"] == "float16"
    assert meta["max_length"] == tiny_encoder.max_length and meta["method"] == "hidden_states"
    expected = tiny_encoder.embed(TEXTS, pool="mean", layers=[1, -1]).astype(np.float16)
    np.testing.assert_array_equal(z["embeddings"], expected)
    assert lw.read_npz_texts(z) == TEXTS
    with pytest.raises(OptionError, match=r"unknown suffix '\.csv'"):
        lw.extract_to_file(tiny_encoder, TEXTS, tmp_path / "s.csv", plan)


def test_store_takes_a_plan(tmp_path, tiny_encoder):
    plan = lw.OutputPlan.parse(pool="word:first", fuse="concat_last4", dtype="float32")
    lw.extract_to_store(tiny_encoder, TEXTS, tmp_path / "w.lw", plan)
    store = lw.open_store(tmp_path / "w.lw")
    exact = tiny_encoder.embed_words(TEXTS, fuse="concat_last4")
    np.testing.assert_array_equal(store[1].vectors, exact[1].vectors)
    # 0.3: the plan is the one way to say it; the 0.2 keywords are gone (CHANGELOG: migration)
    with pytest.raises(TypeError, match="unexpected keyword argument 'pool'"):
        lw.extract_to_store(tiny_encoder, TEXTS, tmp_path / "x.lw", pool="word:first")  # type: ignore[call-arg]
    with pytest.raises(OptionError, match=r"plan must be a layerwise\.OutputPlan, not str"):
        lw.extract_to_store(tiny_encoder, TEXTS, tmp_path / "x.lw", "word:first")  # type: ignore[arg-type]
    assert not (tmp_path / "x.lw").exists()


@pytest.mark.parametrize("spelling", ["mean", "sentence:mean"])
def test_pool_takes_both_spellings(tiny_encoder, spelling):
    """Python's embed() and OutputPlan.parse take "mean" and "sentence:mean" alike (#46, 14)."""
    expected = tiny_encoder.embed(TEXTS, layers=-1, pool="mean")
    np.testing.assert_array_equal(tiny_encoder.embed(TEXTS, layers=-1, pool=spelling), expected)
    assert lw.OutputPlan.parse(pool=spelling).pool == "sentence:mean"
    assert lw.OutputPlan.parse(pool="first").pool == "word:first"


TORCH_FREE = (
    "_results", "_features.plan", "_features.pool", "_features.fuse", "_features.layers", "store",
    "_analysis.stats", "_files.writers", "_files.export",
)  # fmt: skip


@pytest.mark.parametrize("module", TORCH_FREE)
def test_torch_free_modules(module):
    code = f"import sys, layerwise.{module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_store_reads_with_torch_unimportable(tmp_path, tiny_encoder):
    lw.extract_to_store(tiny_encoder, TEXTS, tmp_path / "c.lw")
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any import of torch now raises ImportError
        "import layerwise as lw\n"
        f"s = lw.open_store({str(tmp_path / 'c.lw')!r}); print(len(s), s[0].hidden.shape, s.verify().ok)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "3 (4, 7, 32) True"


def test_layers_that_name_a_fusions_own_hidden_states_are_redundant_not_refused():
    plan = lw.OutputPlan.parse(pool="sentence:mean", fuse="concat_last4", layers="last4")
    assert plan.hidden_states(7) == (3, 4, 5, 6) and plan.hidden_states(13) == (9, 10, 11, 12)
    assert lw.OutputPlan.parse(pool="sentence:mean", fuse="last", layers=-1).hidden_states(7) == (6,)
    with pytest.raises(OptionError, match="uses its own hidden states"):
        lw.OutputPlan.parse(pool="sentence:mean", fuse="concat_last4", layers="3:7")  # last4 only at depth 7
