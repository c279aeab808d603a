"""The edges of the families, where a wrong number could come back without an error: each test here
failed before its fix (issue #81's items named in each)."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from any_models import tiny_config, tokenizer_of
from typer.testing import CliRunner

import layerwise as lw
from layerwise.cli import app
from layerwise.errors import ModelLoadError, OptionError

TEXTS = ["The bank raised rates.", "A longer sentence about the river bank and the fish.", "Hi"]


def _keep(kept: dict, module, args, output) -> None:
    kept["x"] = output[0] if isinstance(output, tuple) else output


def _own_states(folder: Path, texts: list[str], *, raw_last: bool = False) -> list[np.ndarray]:
    """transformers' hidden states of each text alone; ``raw_last``: the last layer's own output
    (hooked on the module) in place of the last state transformers returns."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    model = model.get_encoder() if model.config.is_encoder_decoder else model
    layers = next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList))
    out = []
    for text in texts:
        kept: dict = {}
        hook = layers[-1].register_forward_hook(functools.partial(_keep, kept))
        with torch.no_grad():
            ids = tokenizer(text, return_tensors="pt", return_token_type_ids=False)["input_ids"]
            states = list(model(input_ids=ids, output_hidden_states=True).hidden_states)
        hook.remove()
        if raw_last:
            states[-1] = kept["x"]
        out.append(torch.stack(states)[:, 0].numpy())
    return out


@pytest.mark.parametrize("model_type", ["t5", "modernbert", "opt"])
def test_hooks_and_hidden_states_give_one_truth_and_final_norm_false_is_the_raw_stream(
    model_type, family_folder
):
    """#81 items 1 and 2: T5's and ModernBERT's last state was the raw one by hooks and normed by the
    default, and final_norm=False was accepted and ignored."""
    folder = family_folder(model_type)
    encoder = lw.Encoder(folder, device="cpu")
    normed, raw = _own_states(folder, TEXTS), _own_states(folder, TEXTS, raw_last=True)
    for method in ("hidden_states", "hooks"):
        for stack, want in zip(encoder.extract(TEXTS, layers="all", method=method), normed, strict=True):
            np.testing.assert_allclose(stack.hidden, want, atol=1e-5, rtol=0)
        unnormed = encoder.extract(TEXTS, layers="all", method=method, final_norm=False)
        for stack, want in zip(unnormed, raw, strict=True):
            np.testing.assert_allclose(stack.hidden, want, atol=1e-5, rtol=0)
    assert not np.allclose(normed[0][-1], raw[0][-1])  # the norm matters in these models
    every = encoder.extract(TEXTS[0], layers="all", final_norm="all").hidden
    norm = encoder.model.final_layer_norm if model_type == "t5" else None
    if norm is not None:
        with torch.no_grad():
            np.testing.assert_allclose(every[1], norm(torch.from_numpy(raw[0][1])).numpy(), atol=1e-5)
    assert encoder.run_meta(lw.OutputPlan())["final_norm"] is True  # recorded: it has one


def test_final_norm_all_on_a_model_without_one_names_the_family(family_folder):
    bart = lw.Encoder(family_folder("bart"), device="cpu")
    with pytest.raises(OptionError, match=r"'bart' model\) has none"):
        bart.extract("a text", final_norm="all")
    assert bart.run_meta(lw.OutputPlan())["final_norm"] is None
    same = bart.extract("a text", layers="all", final_norm=False).hidden
    np.testing.assert_array_equal(same, bart.extract("a text", layers="all").hidden)


def test_the_logit_lens_scales_logits_as_the_model_does(family_folder, tmp_path):
    """#81 item 3: Granite divides its logits by logits_scaling (Cohere multiplies by logit_scale)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from layerwise.explore._lens import CausalLMHead, _logit_scale

    folder = tmp_path / "granite"
    shutil.copytree(family_folder("granite"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "logits_scaling": 4.0}))
    encoder = lw.Encoder(folder, device="cpu")
    head = CausalLMHead.load(encoder)
    assert head is not None
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = AutoTokenizer.from_pretrained(folder)("The bank raised", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = model(input_ids=ids).logits[0, -1].numpy()
    raw = encoder.extract("The bank raised", layers=[-1], final_norm=False).hidden[0, -1:]
    np.testing.assert_allclose(head.logits(raw)[0], want, atol=1e-5, rtol=1e-5)
    cohere = type("C", (), {"logit_scale": 0.0625})()
    assert _logit_scale(cohere) == 0.0625


def _pad_last(model_type: str, folder: Path) -> Path:
    """A tiny ``model_type`` whose pad token is the last row of its vocabulary (real OLMo 2, Phi-3)."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    tokenizer = tokenizer_of(model_type)
    tokenizer.add_special_tokens({"pad_token": "<|pad_at_the_end|>"})
    config = tiny_config(model_type, tokenizer)
    config.pad_token_id = len(tokenizer) - 1
    auto = AutoModelForMaskedLM if model_type == "modernbert" else AutoModelForCausalLM
    torch.manual_seed(0)
    auto.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("model_type", ["phi3", "olmo2", "modernbert"])
def test_a_pad_id_at_the_end_of_the_vocabulary_streams(model_type, tmp_path):
    """#81 item 5: the block's word table holds its own rows only."""
    folder = _pad_last(model_type, tmp_path / model_type)
    want = lw.Encoder(folder, device="cpu").extract(TEXTS, layers="all")
    streamed = lw.Encoder(folder, device="cpu", streaming=True, stream_block_tokens=6)
    for a, b in zip(want, streamed.extract(TEXTS, layers="all"), strict=True):
        np.testing.assert_allclose(b.hidden, a.hidden, atol=1e-5, rtol=0)


def _opt_350m(folder: Path) -> Path:
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer_of("opt")
    config = tiny_config("opt", tokenizer)
    config.word_embed_proj_dim, config.do_layer_norm_before = 32, False  # OPT-350m's shape
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_opt_350m_loads_in_memory_and_streaming_is_refused_by_name(tmp_path):
    """#81 items 6 and 7: the residual stream at every layer, the last before project_out."""
    folder = _opt_350m(tmp_path / "opt350m")
    want = _own_states(folder, TEXTS, raw_last=True)
    for packed in (True, False):
        encoder = lw.Encoder(folder, device="cpu", packed=packed)
        for stack, states in zip(encoder.extract(TEXTS, layers="all"), want, strict=True):
            np.testing.assert_allclose(stack.hidden, states, atol=1e-5, rtol=0)
    with pytest.raises(OptionError, match="has none"):
        encoder.extract("a", final_norm="all")
    with pytest.raises(ModelLoadError, match=r"project_in, as OPT-350m.*does not stream yet"):
        lw.Encoder(folder, device="cpu", streaming=True)
    result = CliRunner().invoke(app, ["info", "-m", str(folder), "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["streaming"].startswith("no")


def test_streaming_opt_without_a_final_norm(family_folder, tmp_path):
    """#81 item 7: do_layer_norm_before=False has no final norm to read."""
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer_of("opt")
    config = tiny_config("opt", tokenizer)
    config.do_layer_norm_before = False
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    want = lw.Encoder(tmp_path / "m", device="cpu").extract(TEXTS, layers="all")
    got = lw.Encoder(tmp_path / "m", device="cpu", streaming=True).extract(TEXTS, layers="all")
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(b.hidden, a.hidden, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("model_type", "tap"), [("opt", "mlp_out"), ("modernbert", "attn_out")])
def test_a_tap_the_family_lacks_is_refused_before_any_work(model_type, tap, family_folder, tmp_path):
    """#81 item 8: a KeyError before; the cache left acts/ behind."""
    folder = family_folder(model_type)
    encoder = lw.Encoder(folder, device="cpu")
    with pytest.raises(OptionError, match=f"tap '{tap}' is not available for model type '{model_type}'"):
        encoder.extract("a text", layers=[1], taps=[tap])
    corpus = tmp_path / "c.txt"
    corpus.write_text("The bank raised rates.\n" * 40)
    result = CliRunner().invoke(
        app,
        ["cache", str(corpus), "-o", str(tmp_path / "acts"), "-m", str(folder), "--hooks", tap, "-l", "1"],
    )
    assert result.exit_code == 2, result.output
    assert "is not available" in result.output and not (tmp_path / "acts").exists()


def test_a_nan_weight_in_a_decoder_is_named_by_the_run(family_folder, tmp_path):
    """#81 item 9: the load's final-norm check raised 'atol must be greater than or equal to zero'."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "nan"
    shutil.copytree(family_folder("olmo"), folder)
    weights = load_file(folder / "model.safetensors")
    key = next(k for k in weights if "layers.1.mlp.down_proj" in k)
    weights[key][0, 0] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    encoder = lw.Encoder(folder, device="cpu")
    with pytest.raises(lw.NonFiniteError):
        encoder.extract("The bank raised rates.", layers="all")


def _rewrite(folder: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    change(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        ("extra_layer", "not used by its config.json"),
        ("transposed", "has the shape"),
        ("int32", "holds I32 numbers"),
        ("bool", "holds BOOL numbers"),
        ("vocab", "has the shape"),
    ],
)
def test_streamed_weights_that_do_not_fit_the_config_are_named(damage, says, family_folder, tmp_path):
    """#81 items 4, 10 and 15: the in-memory load named them; streaming returned fewer layers or a raw
    RuntimeError."""
    folder = tmp_path / "m"
    shutil.copytree(family_folder("olmo"), folder)
    config = json.loads((folder / "config.json").read_text())
    if damage == "extra_layer":
        config["num_hidden_layers"] -= 1
    if damage == "vocab":
        config["vocab_size"] += 8
    (folder / "config.json").write_text(json.dumps(config))

    def change(weights):
        key = next(k for k in weights if "layers.0.mlp.up_proj" in k)
        if damage == "transposed":
            weights[key] = weights[key].T.contiguous()
        if damage in ("int32", "bool"):
            weights[key] = weights[key].to(torch.int32 if damage == "int32" else torch.bool)

    _rewrite(folder, change)
    with pytest.raises(ModelLoadError, match=says):
        lw.Encoder(folder, device="cpu", streaming=True)


@pytest.mark.parametrize(
    ("config_text", "says"),
    [
        ("{bad", "config.json is not JSON"),
        ("", "config.json is not JSON"),
        ("[1, 2]", "model_type"),
        ('{"hidden_size": 4}', "model_type"),
        ('{"model_type": "no-such-type"}', "no-such-type"),
        ('{"model_type": "foo", "auto_map": {"AutoConfig": "x.C", "AutoModel": "x.M"}}', "trust_remote_code"),
    ],
)
def test_info_m_refuses_a_bad_config_as_extract_does(config_text, says, tmp_path):
    """#81 item 11: a traceback before."""
    model, text = tmp_path / "m", tmp_path / "t.txt"
    model.mkdir()
    (model / "config.json").write_text(config_text)
    text.write_text("a text\n")
    out = str(tmp_path / "x.npz")
    for command in (["info", "-m", str(model)], ["extract", str(text), "-m", str(model), "-o", out]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2 and says in result.output, result.output
        assert "Traceback" not in result.output


def test_info_m_on_an_uncached_hub_name_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = CliRunner().invoke(app, ["info", "-m", "some-org/never-downloaded"])
    assert result.exit_code == 2 and "not in the Hugging Face cache" in result.output


def test_checkpoints_as_published(family_folder, tmp_path):
    """#81 item 14 and 5: T5's encoder alone (T5EncoderModel: sentence-t5, the text encoders of image
    pipelines), and checkpoints saved from other heads, give the states of the full checkpoint."""
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
        T5EncoderModel,
    )

    t5 = family_folder("t5")
    T5EncoderModel.from_pretrained(t5).save_pretrained(tmp_path / "t5-encoder")
    AutoTokenizer.from_pretrained(t5).save_pretrained(tmp_path / "t5-encoder")
    want = lw.Encoder(t5, device="cpu").extract(TEXTS, layers="all")
    got = lw.Encoder(tmp_path / "t5-encoder", device="cpu").extract(TEXTS, layers="all")
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(b.hidden, a.hidden)
    for source, auto in (
        ("deberta-v2", AutoModelForTokenClassification),
        ("olmo", AutoModelForSequenceClassification),
    ):
        folder = family_folder(source)
        auto.from_pretrained(folder, num_labels=3).save_pretrained(tmp_path / source)
        AutoTokenizer.from_pretrained(folder).save_pretrained(tmp_path / source)
        want = lw.Encoder(folder, device="cpu").extract(TEXTS, layers="all")
        got = lw.Encoder(tmp_path / source, device="cpu").extract(TEXTS, layers="all")
        for a, b in zip(want, got, strict=True):
            np.testing.assert_array_equal(b.hidden, a.hidden)


@pytest.mark.parametrize("model_type", ["longformer", "ibert"])
def test_positions_after_a_padding_row_limit_the_length_whatever_the_type(model_type, tmp_path):
    """Longformer and I-BERT number their learned positions after the padding row, as RoBERTa does:
    a text past max_position_embeddings - pad_token_id - 1 tokens indexed past the table (IndexError).
    The rule is read from the position table (I-BERT's is a quantised embedding), not from a list."""
    from sweep_models import reference_states, save_swept

    folder = save_swept(model_type, tmp_path / model_type)
    config = json.loads((folder / "config.json").read_text())
    encoder = lw.Encoder(folder, device="cpu")
    assert encoder.max_length == config["max_position_embeddings"] - config["pad_token_id"] - 1
    long_text = " ".join(["the river bank"] * 200)
    (truncated,) = encoder.extract([long_text], layers=[-1])
    assert truncated.truncated and truncated.n_tokens == encoder.max_length
    (windowed,) = encoder.extract([long_text], layers=[-1], long_texts="window")
    assert windowed.n_tokens > encoder.max_length and np.isfinite(windowed.hidden).all()
    short = encoder.extract(TEXTS, layers="all")
    for stack, states in zip(short, reference_states(folder, TEXTS), strict=True):
        np.testing.assert_allclose(stack.hidden, states, atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type", ["mamba", "falcon_mamba"])
def test_state_0_is_the_embeddings_where_transformers_leaves_them_out(model_type, tmp_path):
    """Mamba's own states leave out the embeddings and give layer i's output as state i - 1: read as
    given, every layer was one place off and the last two states were the same layer, normed or not.
    Checked here against each layer's input and output, hooked on transformers' own modules."""
    from sweep_models import save_swept
    from transformers import AutoModel, AutoTokenizer

    folder = save_swept(model_type, tmp_path / model_type)
    model = AutoModel.from_pretrained(folder).eval()
    ids = AutoTokenizer.from_pretrained(folder)(TEXTS[1], return_tensors="pt")["input_ids"]
    kept: list[torch.Tensor] = []
    hooks = [
        layer.register_forward_hook(lambda m, a, out: kept.append(out[0] if isinstance(out, tuple) else out))
        for layer in model.layers
    ]
    with torch.no_grad():
        embeddings = model.embeddings(ids)
        model(input_ids=ids, use_cache=False)
        normed = model.norm_f(kept[-1])
    for hook in hooks:
        hook.remove()
    raw = torch.stack([embeddings, *kept])[:, 0].numpy()
    encoder = lw.Encoder(folder, device="cpu")
    for method in ("hidden_states", "hooks"):
        unnormed = encoder.extract(TEXTS[1], layers="all", method=method, final_norm=False).hidden
        np.testing.assert_allclose(unnormed, raw, atol=1e-5, rtol=0)
        given = encoder.extract(TEXTS[1], layers="all", method=method).hidden
        np.testing.assert_allclose(given[:-1], raw[:-1], atol=1e-5, rtol=0)
        np.testing.assert_allclose(given[-1], normed[0].numpy(), atol=1e-5, rtol=0)
    every = encoder.extract(TEXTS[1], layers="all", final_norm="all").hidden
    with torch.no_grad():
        np.testing.assert_allclose(every[2], model.norm_f(torch.from_numpy(raw[2])).numpy(), atol=1e-5)
