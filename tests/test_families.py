"""Every transformer: the families beyond BERT and Llama (any_models.py), each a tiny random model
with a tokenizer of its kind. Every hidden state equals plain transformers' ``output_hidden_states``
in a right-padded batch; pooling, a store round trip and a resumed store run on each; the packed
families' forward and stream equal the general path's; what cannot run is refused by name and
leaves nothing behind."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from any_models import FAMILIES
from conftest import run_app, ud_sentences

import layerwise as lw
from layerwise._model.families.kinds import kind_of
from layerwise._model.forward.packed_decoder import PACKED_DECODER_TYPES, PACKED_ENCODER_TYPES_ON_MODULES
from layerwise.errors import OptionError
from layerwise.store._commit import Committer

TEXTS = [
    "The bank raised rates.",
    "A much longer sentence about the river bank, and the fish that live in it, and a café.",
    "Hi",
    "  leading and trailing spaces  ",
]
PACKED_TYPES = PACKED_DECODER_TYPES + PACKED_ENCODER_TYPES_ON_MODULES
PACKED = [t for t in FAMILIES if t in PACKED_TYPES]


def transformers_states(folder: Path, texts: list[str]) -> tuple[list[np.ndarray], list[int]]:
    """Plain transformers on one right-padded batch (the encoder of an encoder-decoder):
    each text's ``(L + 1, n, H)`` and its length."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    if model.config.is_encoder_decoder:
        model = model.get_encoder()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(texts, return_tensors="pt", padding=True, return_token_type_ids=False)
    with torch.no_grad():
        states = torch.stack(model(**batch, output_hidden_states=True).hidden_states)
    lengths = batch["attention_mask"].sum(1).tolist()
    return [states[:, i, :n].numpy() for i, n in enumerate(lengths)], lengths


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_every_hidden_state_equals_transformers(model_type, family_folder):
    folder = family_folder(model_type)
    encoder = lw.Encoder(folder, device="cpu")
    assert encoder.is_decoder == (kind_of(encoder.config) == "decoder")
    stacks = encoder.extract(TEXTS, layers="all")
    expected, lengths = transformers_states(folder, TEXTS)
    for stack, states, n in zip(stacks, expected, lengths, strict=True):
        assert stack.hidden.shape == states.shape == (4, n, 64)
        np.testing.assert_allclose(stack.hidden, states, atol=1e-5, rtol=0)
    path = "packed" if model_type in PACKED_TYPES else "general"
    assert encoder.run_path == encoder.run_meta(lw.OutputPlan())["forward"] == path


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_pooling_and_a_resumed_store(model_type, family_folder, tmp_path, monkeypatch):
    encoder = lw.Encoder(family_folder(model_type), device="cpu")
    texts = ud_sentences(limit=24)
    stacks = encoder.extract(texts, layers=[-1])
    pool = "last" if encoder.is_decoder else "mean"
    vectors = encoder.embed(texts, layers=[-1], pool=pool)
    expected = np.stack([s.hidden[0, -1] if pool == "last" else s.hidden[0].mean(0) for s in stacks])
    np.testing.assert_allclose(vectors[:, 0], expected, atol=1e-5, rtol=1e-5)

    # a store cut by a full disk after two commits, then resumed: every text as extract gives it
    original, calls = Committer.commit, {"n": 0}

    def failing(self, *args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, *args)

    path, layout = tmp_path / "f.lw", lw.StoreLayout(block_size=8, chunk_rows=4, shard_chunks=2)
    monkeypatch.setattr(Committer, "commit", failing)
    with pytest.raises(lw.StoreError, match="the disk is full"):
        lw.extract_to_store(encoder, texts, path, layout=layout, progress=False)
    monkeypatch.setattr(Committer, "commit", original)
    summary = lw.extract_to_store(encoder, texts, path, layout=layout, progress=False)
    assert summary.resumed and summary.n_already_committed > 0
    store = lw.open_store(path)
    assert store.complete and lw.verify_store(path).ok
    assert store.meta["forward"] == encoder.run_path
    full = encoder.extract(texts, layers="all")
    for i in (0, 9, 23):
        np.testing.assert_allclose(store[i].hidden, full[i].hidden, atol=2e-3, rtol=1e-2)  # float16 store


@pytest.mark.parametrize("model_type", PACKED)
def test_packed_and_streamed_equal_the_general_path(model_type, family_folder):
    """The packed forward, and the stream layer by layer, against transformers' own forward on the
    same batches (packed=False): every hidden state (a decoder's raw and through the final norm too;
    ModernBERT's last through its final norm), the taps, and windows of long texts (ModernBERT's
    local layers see their window)."""
    folder = family_folder(model_type)
    texts = ud_sentences(limit=12) + TEXTS + [" ".join(ud_sentences(limit=6))]
    decoder = model_type in PACKED_DECODER_TYPES
    general = lw.Encoder(folder, device="cpu", packed=False)
    packed = lw.Encoder(folder, device="cpu")
    streamed = lw.Encoder(folder, device="cpu", streaming=True, stream_block_tokens=64)
    others = [packed, streamed]
    assert general.run_path == "general" and packed.run_path == "packed" and streamed.run_path == "streamed"
    for final_norm in (True, False, "all") if decoder else (True,):
        want = general.extract(texts, layers="all", final_norm=final_norm)
        for other in others:
            got = other.extract(texts, layers="all", final_norm=final_norm)
            for a, b in zip(want, got, strict=True):
                np.testing.assert_allclose(b.hidden, a.hidden, atol=1e-5, rtol=0)
    short = dict(layers="all", max_tokens=256)
    want = lw.Encoder(folder, device="cpu", packed=False, max_length=16).extract(
        texts[-1], long_texts="window", **short
    )
    got = lw.Encoder(folder, device="cpu", max_length=16).extract(texts[-1], long_texts="window", **short)
    assert got.n_windows > 1
    np.testing.assert_allclose(got.hidden, want.hidden, atol=1e-5, rtol=0)
    if not decoder:
        return
    taps = ("attn_out",) if model_type == "opt" else ("attn_out", "mlp_out")  # OPT: no mlp module
    want = general.extract(texts[:4], layers=[1, 3], taps=taps)
    got = packed.extract(texts[:4], layers=[1, 3], taps=taps)
    for a, b in zip(want, got, strict=True):
        for tap in taps:
            np.testing.assert_allclose(b.taps[tap], a.taps[tap], atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type", ["gpt_neox", "falcon", "t5"])
def test_a_layer_subset_equals_the_full_run(model_type, family_folder):
    """A run cut at layer 2 gives that layer's own output, never one passed through the final norm
    (T5's encoder and Falcon norm the last layer they run)."""
    encoder = lw.Encoder(family_folder(model_type), device="cpu", packed=False)
    full = encoder.extract(TEXTS, layers="all")
    cut = encoder.extract(TEXTS, layers=[1, 2])
    for a, b in zip(full, cut, strict=True):
        np.testing.assert_array_equal(b.hidden, a.hidden[1:3])


def test_windows_on_a_general_decoder_keep_their_left_context(family_folder):
    encoder = lw.Encoder(family_folder("falcon"), device="cpu", max_length=16)
    text = " ".join(ud_sentences(limit=3))
    stack = encoder.extract(text, layers="all", long_texts="window")
    assert stack.n_windows > 1 and stack.hidden.shape[1] == len(stack.tokens)


def test_pairs_run_where_the_tokenizer_has_them(family_folder):
    encoder = lw.Encoder(family_folder("deberta-v2"), device="cpu")
    stack = encoder.extract(["The bank raised rates."], text_pairs=["It was a river."], layers="all")[0]
    assert set(stack.segment_ids) == {0, 1} and stack.text_pair == "It was a river."
    with pytest.raises(lw.InputError, match="pair"):
        lw.Encoder(family_folder("gpt_neox"), device="cpu").extract(["a"], text_pairs=["b"])


def test_taps_and_final_norm_name_what_a_general_family_has(family_folder):
    t5 = lw.Encoder(family_folder("t5"), device="cpu")
    with pytest.raises(
        OptionError, match=r"tap 'mlp_out' is not available for model type 't5'.*docs/models\.md"
    ):
        t5.extract("a text", taps=["mlp_out"])
    falcon = lw.Encoder(family_folder("falcon"), device="cpu")
    normed = falcon.extract(TEXTS, layers="all", final_norm="all")
    raw = falcon.extract(TEXTS, layers="all", final_norm=False)
    norm = falcon.model.ln_f
    with torch.no_grad():
        expected = norm(torch.from_numpy(raw[1].hidden)).numpy()
    np.testing.assert_allclose(normed[1].hidden, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("model_type", "expected"),
    [
        ("bert", "encoder"), ("roberta", "encoder"), ("modernbert", "encoder"), ("deberta-v2", "encoder"),
        ("llama", "decoder"), ("gpt_neox", "decoder"), ("opt", "decoder"), ("mixtral", "decoder"),
        ("t5", "encoder-decoder"), ("bart", "encoder-decoder"),
    ],
)  # fmt: skip
def test_the_kind_comes_from_transformers_mappings(model_type, expected):
    from transformers import CONFIG_MAPPING

    assert kind_of(CONFIG_MAPPING[model_type]()) == expected


@pytest.mark.parametrize(
    ("model_type", "says"),
    [
        ("swin", "hierarchical image model"),
        ("audio-spectrogram-transformer", "does not read text"),
        ("llava", "multimodal model"),
    ],
)
def test_what_cannot_run_is_refused_by_type_and_leaves_nothing(model_type, says, family_folder, tmp_path):
    from transformers import CONFIG_MAPPING

    folder = tmp_path / "m"
    shutil.copytree(family_folder("gpt_neox"), folder)
    (folder / "config.json").write_text(CONFIG_MAPPING[model_type]().to_json_string())
    with pytest.raises(lw.ModelLoadError, match=f"is a '{model_type}' model.*{says}"):
        lw.Encoder(folder, device="cpu")
    out = tmp_path / "out.lw"
    from typer.testing import CliRunner

    from layerwise.cli import app

    (tmp_path / "t.txt").write_text("one text\n")
    result = CliRunner().invoke(app, ["extract", str(tmp_path / "t.txt"), "-o", str(out), "-m", str(folder)])
    assert result.exit_code == 2 and model_type in result.output and not out.exists()


def test_remote_code_runs_only_when_asked(family_folder, tmp_path):
    """A config whose model comes as Python code beside it: refused without the setting; with it,
    the code runs (the logit lens's head is read with it too), and read_meta records that it was
    asked for."""
    folder = tmp_path / "remote"
    shutil.copytree(family_folder("gpt_neox"), folder)
    (folder / "remote_neox.py").write_text(
        "from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, GPTNeoXModel\n"
        "class RemoteConfig(GPTNeoXConfig):\n    model_type = 'remote_neox'\n"
        "class RemoteModel(GPTNeoXModel):\n    config_class = RemoteConfig\n"
        "class RemoteLM(GPTNeoXForCausalLM):\n    config_class = RemoteConfig\n"
    )
    # transformers renames GPT-NeoX's saved head (embed_out) for its own class only: as a remote
    # model's checkpoint would hold it
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    weights["lm_head.weight"] = weights.pop("embed_out.weight")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "remote_neox"
    config["auto_map"] = {
        "AutoConfig": "remote_neox.RemoteConfig",
        "AutoModel": "remote_neox.RemoteModel",
        "AutoModelForCausalLM": "remote_neox.RemoteLM",
    }
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        lw.ModelLoadError, match=r"runs Python code.*trust_remote_code=True \(--trust-remote-code\)"
    ):
        lw.Encoder(folder, device="cpu")
    encoder = lw.Encoder(folder, device="cpu", trust_remote_code=True)
    assert encoder.is_decoder and encoder.settings.trust_remote_code
    plain = lw.Encoder(family_folder("gpt_neox"), device="cpu", packed=False).extract(TEXTS[0], layers="all")
    np.testing.assert_allclose(encoder.extract(TEXTS[0], layers="all").hidden, plain.hidden, atol=1e-6)
    from layerwise.explore._lens import load_lens_head

    native = load_lens_head(lw.Encoder(family_folder("gpt_neox"), device="cpu"))
    head = load_lens_head(encoder)
    assert head is not None and native is not None
    raw = plain.hidden[-2]
    np.testing.assert_allclose(head.logits(raw), native.logits(raw), atol=1e-6)
    lw.extract_to_file(encoder, TEXTS, tmp_path / "r.npz", progress=False)
    meta = lw.read_meta(tmp_path / "r.npz")
    assert meta["trust_remote_code"] is True and meta["forward"] == "general"


@pytest.mark.parametrize(
    "model_type", ["gpt_neox", "phi", "olmo2", "stablelm", "starcoder2", "mixtral", "qwen2_moe"]
)
def test_taps_are_what_each_block_adds(model_type, family_folder):
    """attn_out and mlp_out are what a layer's attention and feed-forward add to the residual
    stream: hidden state l is hidden state l-1 plus both (in parallel blocks, GPT-NeoX's and Phi's,
    as in sequential ones; after OLMo-2's output norms)."""
    encoder = lw.Encoder(family_folder(model_type), device="cpu")
    for stack in encoder.extract(TEXTS[:2], layers="all", taps=["attn_out", "mlp_out"], final_norm=False):
        added = stack.taps["attn_out"] + stack.taps["mlp_out"]  # (3, T, H): layers 1 … 3
        np.testing.assert_allclose(stack.hidden[1:], stack.hidden[:-1] + added, atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type", ["falcon", "t5"])
def test_the_cache_layers_and_lens_take_a_general_family(model_type, family_folder, tmp_path):
    """The activation cache, `layerwise layers` and the logit lens on transformers' own forward: a
    general decoder (Falcon: its final norm found at load, its untied head read) and T5's encoder
    (no masked-LM head: no lens)."""
    from typer.testing import CliRunner

    from layerwise.cli import app
    from layerwise.explore._lens import load_lens_head

    folder = family_folder(model_type)
    encoder = lw.Encoder(folder, device="cpu")
    texts = ud_sentences(limit=40)
    options = lw.CacheOptions(layers=[1, 2], tokens=400, context=16)
    lw.cache_activations(encoder, texts, tmp_path / "c", options, progress=False)
    cache = lw.load_cache(tmp_path / "c")
    assert len(cache) * 16 >= 400
    head = load_lens_head(encoder)
    assert (head is not None) == encoder.is_decoder
    if head is not None:  # the lens at the last layer is the model's own next-token logits
        from transformers import AutoModelForCausalLM, AutoTokenizer

        lm = AutoModelForCausalLM.from_pretrained(folder).eval()
        ids = AutoTokenizer.from_pretrained(folder)(TEXTS[0], return_tensors="pt")
        with torch.no_grad():
            expected = lm(**ids).logits[0].numpy()
        raw = encoder.extract(TEXTS[0], layers=[-1], final_norm=False).hidden[0]
        np.testing.assert_allclose(head.logits(raw), expected, atol=1e-4, rtol=1e-4)
    (tmp_path / "t.txt").write_text("\n".join(texts))
    pool = ["--pool", "sentence:last"] if encoder.is_decoder else []
    result = CliRunner().invoke(app, ["layers", str(tmp_path / "t.txt"), "-m", str(folder), "-q", *pool])
    assert result.exit_code == 0, result.output
    assert "try first" in result.output


def test_the_server_embeds_with_a_packed_and_a_general_family(family_folder):
    """/v1/embeddings on Pythia's family (packed) and T5's encoder (general): each the vector embed
    gives, pooled as the model's kind pools by default."""
    import asyncio

    from layerwise.serve import create_app

    encoders = {t: lw.Encoder(family_folder(t), device="cpu") for t in ("gpt_neox", "t5")}
    app = create_app(encoders)

    pools = {t: "last" if e.is_decoder else "mean" for t, e in encoders.items()}

    async def main(client):
        answers = {}
        for t in encoders:
            asked = {"input": TEXTS[:2], "model": t, "pool": pools[t], "normalize": False}
            answers[t] = await asyncio.wait_for(client.post("/v1/embeddings", json=asked), 60)
        return answers

    for model_type, response in run_app(app, main).items():
        assert response.status_code == 200, response.text
        served = np.array([row["embedding"] for row in response.json()["data"]], dtype=np.float32)
        direct = encoders[model_type].embed(TEXTS[:2], layers=[-1], pool=pools[model_type])[:, 0]
        np.testing.assert_allclose(served, direct, atol=1e-5, rtol=1e-5)


def test_info_says_how_a_model_will_run_before_loading_it(family_folder):
    from typer.testing import CliRunner

    from layerwise.cli import app

    said = {}
    for model_type in ("gpt_neox", "falcon", "t5", "modernbert"):
        result = CliRunner().invoke(app, ["info", "-m", str(family_folder(model_type)), "--json"])
        assert result.exit_code == 0, result.output
        said[model_type] = json.loads(result.output)
    assert said["gpt_neox"] | {"model": None} == {
        "model": None, "model_type": "gpt_neox", "modality": "text", "units": "tokens", "kind": "decoder",
        "layers": 3, "hidden_size": 64,
        "forward": "packed", "streaming": "yes", "positions": "rotary",
        "taps": "attention_probs, attn_out, mlp_out",
        "final_norm": "yes: final_norm True, False or 'all'", "pairs": "no (join the texts yourself)",
    }  # fmt: skip
    assert (said["falcon"]["forward"], said["falcon"]["streaming"]) == ("general", "no: load it in memory")
    assert said["t5"]["kind"] == "encoder of an encoder-decoder" and said["t5"]["forward"] == "general"
    assert (said["modernbert"]["forward"], said["modernbert"]["streaming"]) == ("packed", "yes")
    for model_type, facts in said.items():  # what a load then runs
        assert lw.Encoder(family_folder(model_type), device="cpu").run_path == facts["forward"]
    result = CliRunner().invoke(app, ["info", "out.npz", "-m", str(family_folder("t5"))])
    assert result.exit_code == 2 and "not both" in result.output
