"""The sweep: every type of transformers' masked-LM, causal-LM and sequence-to-sequence mappings,
built tiny and random from its config class with generic small settings (sweep_models.py) and saved
with a tokenizer, is loaded by layerwise and compared with transformers' own ``output_hidden_states``
of each text alone, by both methods. Each type is equal, skipped (transformers cannot build or run it
with those settings), or refused for a listed reason (sweep_models.REFUSALS). A new transformers
release that adds a type is swept at once; benchmarks/family_sweep.py writes the counts that
docs/models.md shows."""

from __future__ import annotations

import functools

import pytest
import sweep_models
from sweep_models import sweep_one, swept_types

pytestmark = pytest.mark.slow

# types refused today, and why: a type refused for another reason, or one that starts to load, fails
# here until this table says so
REFUSED = {
    "dory": "not one state per layer",
    "funnel": "states change shape",
    "hy_v4": "states change shape",
    "qwen4_exp_text": "states change shape",
    "pegasus_x": "states change shape",
    "xmod": "needs a language",
    "trocr": "no model class",
    "encoder-decoder": "no model class",
    "gemma4_unified_assistant": "no model class",
    "deepseek_v4": "missing weights",
}


@pytest.fixture(scope="module", autouse=True)
def _one_tokenizer_per_kind(monkeypatch_module):
    monkeypatch_module.setattr(sweep_models, "tokenizer_for", functools.cache(sweep_models.tokenizer_for))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.parametrize("model_type", swept_types())
def test_every_text_type_equals_transformers_or_is_refused_by_name(model_type, tmp_path):
    result = sweep_one(model_type, tmp_path / model_type)
    outcome = result["outcome"]
    if outcome == "skipped":
        pytest.skip(f"{model_type}: {result['why']}")
    if outcome == "media":  # read from images or sound: its equality is the media tests'
        return
    if outcome == "refused":
        reason = result["reason"]
        if reason in ("not text", "multimodal"):
            return  # said from the config alone (families/kinds.py), before any weight is read
        assert REFUSED.get(model_type) == reason, result
        return
    assert outcome == "equal", result
    assert model_type not in REFUSED, f"{model_type} now loads: take it out of REFUSED"
