"""The from-scratch BERT equals Hugging Face's BertModel at every layer; packed == padded; pretraining."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import layerwise as lw
from layerwise.errors import ModelLoadError, OptionError
from layerwise.reference import Bert, BertConfig, PretrainSettings, pretrain
from layerwise.reference.examples import SPECIAL_TOKENS, mask_tokens

TEXTS = ["The bank raised rates.", "Hi", "A longer sentence that needs no padding at all, unlike the others."]


def hf_hidden(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack(model(**batch, output_hidden_states=True).hidden_states)


def test_default_model_parity_every_layer(default_encoder, default_hf_model):
    ref = Bert.from_hf(default_hf_model)
    batch = default_encoder.tokenizer(
        TEXTS, ["Yes.", "Hello there", "Fine."], padding=True, return_tensors="pt"
    )
    assert batch["attention_mask"].min() == 0 and batch["token_type_ids"].max() == 1
    with torch.no_grad():
        ours = ref(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    theirs = hf_hidden(default_hf_model, batch)
    real = batch["attention_mask"].bool()
    assert ours.shape == theirs.shape == (7, 3, batch["input_ids"].shape[1], 384)
    assert (ours - theirs)[:, real].abs().max() <= 1e-5


@pytest.mark.parametrize(
    ("hidden", "layers", "heads", "inner"), [(32, 2, 4, 64), (64, 3, 8, 128), (48, 5, 3, 200)]
)
def test_random_configs_parity(hidden, layers, heads, inner):
    from transformers import BertConfig as HFConfig
    from transformers import BertModel

    torch.manual_seed(hidden + layers)
    config = HFConfig(vocab_size=300, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads)
    config.intermediate_size, config.max_position_embeddings = inner, 64
    hf = BertModel(config).eval()
    ref = Bert.from_hf(hf)
    ids = torch.randint(5, 300, (4, 20))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    mask[3, 5:] = 0
    types = torch.zeros_like(ids)
    types[:, 8:] = 1
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    with torch.no_grad():
        ours = ref(ids, types, mask)
    theirs = hf_hidden(hf, batch)
    assert (ours - theirs)[:, mask.bool()].abs().max() <= 1e-5


def test_packed_equals_padded(default_encoder, default_hf_model):
    ref = Bert.from_hf(default_hf_model)
    encoded = default_encoder.tokenize(TEXTS)
    batch = default_encoder.tokenizer(TEXTS, padding=True, return_tensors="pt")
    lengths = torch.tensor([len(e) for e in encoded])
    packed_ids = torch.tensor([i for e in encoded for i in e.ids])
    with torch.no_grad():
        padded = ref(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        packed = ref.forward_packed(packed_ids, torch.zeros_like(packed_ids), lengths)
    real = batch["attention_mask"].bool()
    assert packed.shape == (7, int(lengths.sum()), 384)
    assert (packed - padded[:, real]).abs().max() <= 1e-5


def test_from_hf_checks(tmp_path, make_tiny_model):
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        Bert.from_hf(tmp_path)
    with pytest.raises(ModelLoadError, match="model type 'distilbert'"):
        Bert.from_hf(make_tiny_model("distilbert"))
    assert Bert.from_hf(make_tiny_model("bert")).config.num_hidden_layers == 3
    with pytest.raises(OptionError, match="not divisible"):
        BertConfig(hidden_size=30, num_attention_heads=4)


def test_masking_follows_80_10_10():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (400, 100))
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = True
    masked, chosen = mask_tokens(ids, special, mask_id=4, vocab_size=1000, n_special=len(SPECIAL_TOKENS),
                                 generator=generator)  # fmt: skip
    rate = chosen[:, 1:].float().mean().item()
    assert abs(rate - 0.15) < 0.01 and not chosen[:, 0].any()
    picked_masked = masked[chosen]
    as_mask = (picked_masked == 4).float().mean().item()
    unchanged = (picked_masked == ids[chosen]).float().mean().item()
    assert abs(as_mask - 0.8) < 0.02
    assert abs(unchanged - 0.1) < 0.02  # (a random token equal to the original is rare)
    assert (masked[~chosen] == ids[~chosen]).all()


def test_pretrain_saves_a_folder_encoder_loads(tmp_path):
    corpus = tmp_path / "corpus.txt"
    words = "the cat sat on a mat while dogs ran in parks and birds sang over trees".split()
    rng = np.random.default_rng(0)
    documents = []
    for _ in range(30):
        sentences = [" ".join(rng.choice(words, size=rng.integers(4, 10))) + " ." for _ in range(6)]
        documents.append("\n".join(sentences))
    corpus.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    settings = PretrainSettings(
        layers=2, hidden=32, heads=4, vocab_size=200, max_length=32, batch_size=8, steps=30
    )
    result = pretrain(corpus, tmp_path / "tiny", settings, progress=False)
    assert set(result["held_out"]) == {"mlm_accuracy", "mlm_baseline", "nsp_accuracy"}
    assert result["log"][-1]["step"] == 30
    log = json.loads((tmp_path / "tiny" / "pretraining_log.json").read_text())
    assert log["settings"]["layers"] == 2
    enc = lw.Encoder(tmp_path / "tiny", device="cpu")
    assert enc.n_layers == 2 and enc.hidden_size == 32
    stack = enc.extract(["the cat sat on a mat ."])[0]
    assert stack.hidden.shape[0] == 3 and stack.tokens[0] == "[CLS]"
    # the saved weights are the trained ones: the reference model reloads them exactly
    ref = Bert.from_hf(tmp_path / "tiny")
    ids = torch.tensor([enc.tokenizer("the cat sat")["input_ids"]])
    with torch.no_grad():
        ours = ref(ids)[-1, 0]
    np.testing.assert_allclose(ours.numpy(), enc.extract(["the cat sat"])[0].hidden[-1], atol=1e-5)
