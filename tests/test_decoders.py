"""Decoder language models: every family's hidden states equal transformers' own, with the same
index convention, the final norm said and tested, last-token pooling, relative layer specs, pairs
refused, and word alignment on byte-level BPE and SentencePiece-style tokenizers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from alignment_invariants import bytes_not_in_vocabulary, check_stack, check_words
from conftest import needs_smollm2, run_app, smollm2_folder, ud_sentences
from decoder_models import DECODER_ARCHITECTURES, save_decoder

import layerwise as lw
from layerwise.errors import InputError, LayerSpecError, OptionError

TEXTS = [
    "The bank raised rates.",
    "A much longer sentence about the river bank, and the fish that live in it, and a café.",
    "Hi",
    "  leading and trailing spaces  ",
]


def reference(folder: Path, text: str, *, final_norm: bool = True) -> np.ndarray:
    """transformers' own hidden states of one text, unpadded: ``(L + 1, T, H)``. Without the final
    norm, the last one is read off the last layer's output with a hook."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(text, return_tensors="pt")
    seen: list[torch.Tensor] = []
    layers = getattr(model, "layers", None) or model.h
    handle = layers[-1].register_forward_hook(
        lambda module, args, output: seen.append(output[0] if isinstance(output, tuple) else output)
    )
    with torch.no_grad():
        output = model(**ids, output_hidden_states=True)
    handle.remove()
    states = torch.stack(output.hidden_states)[:, 0]
    assert torch.equal(states[-1], output.last_hidden_state[0])  # transformers' convention: after the norm
    if not final_norm:
        states[-1] = seen[-1][0]
    return states.numpy()


@pytest.mark.parametrize("arch", DECODER_ARCHITECTURES)
def test_every_hidden_state_equals_transformers(arch, decoder_folder, decoder_encoder):
    """Mixed lengths in one right-padded batch: each text's states equal its own unpadded run."""
    encoder = decoder_encoder(arch)
    assert encoder.is_decoder and encoder.n_hidden_states == 4
    stacks = encoder.extract(TEXTS, layers="all")
    for text, stack in zip(TEXTS, stacks, strict=True):
        expected = reference(decoder_folder(arch), text)
        assert stack.hidden.shape == expected.shape
        np.testing.assert_allclose(stack.hidden, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", DECODER_ARCHITECTURES)
def test_the_packed_forward_equals_the_padded_one(arch, decoder_folder, decoder_encoder):
    """The packed forward (every family) against transformers' padded forward on the same
    texts, every layer, and stopping early at each depth; sliding windows shorter than a text and
    Gemma 2's soft-capped scores included (its window is 64 tokens here)."""
    from layerwise._model.forward.packed_decoder import PackedDecoder

    packed = decoder_encoder(arch)
    assert isinstance(packed.engine.packed, PackedDecoder)
    padded = lw.Encoder(decoder_folder(arch), device="cpu", packed=False)
    long_text = " ".join(ud_sentences(limit=12))  # over 64 tokens: the sliding window matters
    texts = [*TEXTS, long_text, *ud_sentences(limit=20)]
    for layers in ("all", [1], [2, 0]):
        ours, theirs = packed.extract(texts, layers=layers), padded.extract(texts, layers=layers)
        for a, b in zip(ours, theirs, strict=True):
            assert a.tokens == b.tokens
            np.testing.assert_allclose(a.hidden, b.hidden, atol=1e-5, rtol=0)


def test_qwen2_with_per_layer_sliding_windows_runs_packed(tmp_path):
    """Qwen2's use_sliding_window: a full-attention first layer, then windows of 8 tokens, shorter
    than the texts; packed = transformers' padded forward."""
    import transformers as tf
    from decoder_models import byte_level_tokenizer, decoder_config

    tokenizer = byte_level_tokenizer()
    settings = decoder_config("qwen2", tokenizer).to_dict()
    settings.update(layer_types=None, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    config = tf.Qwen2Config(**settings)
    assert config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    packed, padded = lw.Encoder(tmp_path, device="cpu"), lw.Encoder(tmp_path, device="cpu", packed=False)
    assert packed.engine.packed is not None and padded.engine.packed is None
    for ours, theirs in zip(packed.extract(TEXTS), padded.extract(TEXTS), strict=True):
        np.testing.assert_allclose(ours.hidden, theirs.hidden, atol=1e-5)


def test_two_concurrent_forwards_run_packed_decoder_batches_at_once(decoder_folder):
    one = lw.Encoder(decoder_folder("qwen3"), device="cpu", concurrent_forwards=1)
    two = lw.Encoder(decoder_folder("qwen3"), device="cpu", concurrent_forwards=2, max_tokens=64)
    assert two.engine.pool is not None
    texts = ud_sentences(limit=60)
    for a, b in zip(one.extract(texts), two.extract(texts), strict=True):
        np.testing.assert_allclose(a.hidden, b.hidden, atol=1e-5, rtol=0)
    assert two.model.config._attn_implementation != "layerwise_packed"  # the model's own, after


def test_concurrent_forwards_record_each_batch_s_own_taps(decoder_folder):
    """Each concurrent forward runs on a replica of its own (forward/replica.py): the taps one
    batch records never land in another's, whatever order the batches finish in."""
    taps = ("attn_out", "mlp_out")
    one = lw.Encoder(decoder_folder("qwen3"), device="cpu", concurrent_forwards=1)
    two = lw.Encoder(decoder_folder("qwen3"), device="cpu", concurrent_forwards=2, max_tokens=64)
    texts = ud_sentences(limit=40)
    for a, b in zip(one.extract(texts, taps=taps), two.extract(texts, taps=taps), strict=True):
        assert a.taps.keys() == b.taps.keys() == set(taps)
        for tap in taps:
            np.testing.assert_allclose(a.taps[tap], b.taps[tap], atol=1e-5, rtol=0)
    assert 1 <= len(two.engine.packed._replicas._free) <= 2  # at most one per forward running at once


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2"])
def test_the_final_norm_either_way(arch, decoder_folder, decoder_encoder):
    raw = decoder_encoder(arch, final_norm=False).extract(TEXTS[1], layers="all").hidden
    normed = decoder_encoder(arch).extract(TEXTS[1], layers="all").hidden
    expected = reference(decoder_folder(arch), TEXTS[1], final_norm=False)
    np.testing.assert_allclose(raw, expected, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(raw[:-1], normed[:-1])  # only the last differs
    assert np.abs(raw[-1] - normed[-1]).max() > 1e-2
    # the hooks path says the same as output_hidden_states
    hooked = decoder_encoder(arch).extract(TEXTS[1], layers="all", method="hooks").hidden
    np.testing.assert_allclose(hooked, normed, atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_final_norm_all_passes_every_hidden_state_through_the_norm(arch, decoder_folder, decoder_encoder):
    """final_norm="all": hidden state k = the model's final norm of the raw hidden state k, for
    every k, on the packed, the padded and the hooks paths; the logit lens reads the same logits."""
    from layerwise._model.final_norm import final_norm_module
    from layerwise.explore import logit_lens

    raw = decoder_encoder(arch, final_norm=False)
    norm = final_norm_module(raw.model)
    every = lw.Encoder(decoder_folder(arch), device="cpu", final_norm="all")
    padded = lw.Encoder(decoder_folder(arch), device="cpu", final_norm="all", packed=False)
    for r, a, b, c in zip(raw.extract(TEXTS), every.extract(TEXTS), padded.extract(TEXTS),
                          padded.extract(TEXTS, method="hooks"), strict=True):  # fmt: skip
        with torch.no_grad():
            expected = norm(torch.from_numpy(r.hidden)).numpy()
        for ours in (a, b, c):
            np.testing.assert_allclose(ours.hidden, expected, atol=1e-5)
    stopped, full = every.extract(TEXTS[1], layers=[2]), every.extract(TEXTS[1])  # stops after layer 2
    np.testing.assert_allclose(stopped.hidden, full.hidden[[2]], atol=1e-5)
    ours, theirs = logit_lens(every, TEXTS[0], k=3), logit_lens(raw, TEXTS[0], k=3)
    for layer_ours, layer_theirs in zip(ours["masks"][0]["predictions"], theirs["masks"][0]["predictions"],
                                        strict=True):  # fmt: skip
        assert [t for t, _ in layer_ours] == [t for t, _ in layer_theirs]
        np.testing.assert_allclose([p for _, p in layer_ours], [p for _, p in layer_theirs], atol=1e-5)


def test_final_norm_all_is_for_models_with_a_final_norm(tiny_encoder):
    with pytest.raises(OptionError, match=r"final_norm=.all. .* \(a 'bert' model\) has none"):
        lw.Encoder(tiny_encoder.source, device="cpu", final_norm="all")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_stopping_early_never_norms_an_intermediate_layer(arch, decoder_encoder):
    encoder = decoder_encoder(arch)
    full = encoder.extract(TEXTS, layers="all")
    for layer in (1, 2):
        cut = encoder.extract(TEXTS, layers=[layer])
        for a, b in zip(cut, full, strict=True):
            np.testing.assert_allclose(a.hidden[0], b.hidden[layer], atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_last_token_pooling_equals_a_plain_loop(arch, decoder_folder, decoder_encoder):
    encoder = decoder_encoder(arch)
    pooled = encoder.embed(TEXTS, layers=-1, pool="last")
    expected = np.stack([reference(decoder_folder(arch), t)[-1, -1] for t in TEXTS])
    np.testing.assert_allclose(pooled, expected, atol=1e-5, rtol=0)
    assert lw.OutputPlan.parse(layers="-1", pool="sentence:last").pool == "sentence:last"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_windows_of_a_causal_model_keep_each_tokens_left_context(arch, decoder_folder):
    """A long text in windows: every token comes from the first window that holds it (its most left
    context), so the first window's tokens equal one unwindowed forward's, and each later token is
    its window's row at its furthest position from the window's start."""
    from layerwise._inputs.raw import normalize_inputs
    from layerwise._inputs.windows import best_window, plan_windows

    text = " ".join(ud_sentences(limit=4))
    short = lw.Encoder(decoder_folder(arch), device="cpu", max_length=24)
    whole = lw.Encoder(decoder_folder(arch), device="cpu").extract(text)
    windowed = short.extract(text, long_texts="window")
    assert windowed.n_windows > 3 and windowed.tokens == whole.tokens
    np.testing.assert_allclose(windowed.hidden[:, :24], whole.hidden[:, :24], atol=1e-5)
    assert np.abs(windowed.hidden[:, 24:] - whole.hidden[:, 24:]).max() > 1e-3  # less context there
    item = short.inputs.encode(normalize_inputs([text]), truncate=False)[0]
    windows = plan_windows(item, 24, causal=True)
    source, _ = best_window(windows, len(item))
    first_holder = [min(k for k, w in enumerate(windows) if p in w.positions) for p in range(len(item))]
    assert source.tolist() == first_holder


def test_special_tokens_exclude_leaves_the_bos_out(decoder_encoder):
    encoder = decoder_encoder("llama")  # its template puts <s> in front of every text
    stack = encoder.extract(TEXTS[0], layers="all")
    assert stack.tokens[0] == "<s>" and stack.word_ids[0] == -1
    mean = encoder.embed(TEXTS[0], layers=-1, pool="mean", special_tokens="exclude")
    np.testing.assert_allclose(mean, stack.hidden[-1, 1:].mean(0), atol=1e-6)
    first = encoder.embed(TEXTS[0], layers=-1, pool="mean", special_tokens="include")
    assert not np.allclose(first, mean)


def test_relative_depths_name_the_same_place_in_any_model(decoder_encoder, tmp_path):
    deep = lw.Encoder(save_decoder("llama", tmp_path / "deep", n_layers=8), device="cpu")
    shallow = decoder_encoder("llama")
    assert deep.n_hidden_states == 9 and shallow.n_hidden_states == 4
    np.testing.assert_array_equal(deep.embed(TEXTS, layers=0.5), deep.embed(TEXTS, layers=4))
    np.testing.assert_array_equal(shallow.embed(TEXTS, layers=0.5), shallow.embed(TEXTS, layers=2))
    # a string keeps the axis, as "4" does
    np.testing.assert_array_equal(deep.embed(TEXTS, layers="0.5"), deep.embed(TEXTS, layers=[4]))
    stacked = deep.embed(TEXTS, layers="0.25,0.5,0.75", pool="last")
    assert stacked.shape == (len(TEXTS), 3, 64)
    np.testing.assert_array_equal(stacked[:, 0], deep.embed(TEXTS, layers=2, pool="last"))
    with pytest.raises(LayerSpecError, match=r"relative depth 1\.5 must lie in 0\.0"):
        deep.embed(TEXTS, layers=1.5)


def test_pairs_and_taps_are_refused_with_the_way_out(decoder_encoder):
    encoder = decoder_encoder("gpt2")
    with pytest.raises(InputError, match=r"no text pairs\. Join each pair into one text"):
        encoder.extract(["a"], text_pairs=["b"])
    with pytest.raises(OptionError, match="decoder"):
        encoder.extract(["a"], taps=["attention_output"])


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_word_alignment_on_decoder_tokenizers(arch, decoder_encoder):
    """Byte-level BPE (GPT-2) and SentencePiece-style BPE with byte fallback (Llama): spans, word
    ids and pre-split words hold as for WordPiece."""
    encoder = decoder_encoder(arch)
    texts = [*TEXTS, *ud_sentences(limit=40), "naïve café — Zürich's 3.5% rise!", "emoji 🙂 ok"]
    for text, stack in zip(texts, encoder.extract(texts, layers=[0]), strict=True):
        check_stack(encoder, stack, text)
    lists = [t.split() for t in ud_sentences(limit=40)]
    stacks, vectors_of = encoder.extract(words=lists, layers=[0]), encoder.embed_words(words=lists, layers=-1)
    for words, stack, vectors in zip(lists, stacks, vectors_of, strict=True):
        check_stack(encoder, stack, " ".join(words))
        assert stack.words == tuple(words)
        assert vectors.words == tuple(words) and vectors.vectors.shape == (len(words), 64)


def test_a_store_of_a_decoder_resumes_and_verifies(decoder_encoder, tmp_path):
    encoder = decoder_encoder("qwen2")
    texts = ud_sentences(limit=30)
    lw.extract_to_store(encoder, texts, tmp_path / "q.lw", progress=False)
    store = lw.open_store(tmp_path / "q.lw")
    assert len(store) == 30 and lw.verify_store(tmp_path / "q.lw").ok
    assert store.meta["final_norm"] is True
    np.testing.assert_allclose(store[3].hidden, encoder.extract(texts[3]).hidden, atol=2e-3, rtol=1e-2)
    # the last hidden state before the norm is another number: such a run never resumes this store
    with pytest.raises(lw.StoreError, match="final_norm: stored True, now False"):
        lw.extract_to_store(decoder_encoder("qwen2", final_norm=False), texts, tmp_path / "q.lw")


@pytest.mark.parametrize(("arch", "final_norm"), [("llama", True), ("qwen2", False), ("gemma2", True)])
def test_logit_lens_reads_every_layer_through_the_models_own_head(arch, final_norm, decoder_folder):
    """At the last layer the lens gives the model's own next-token distribution (its final norm,
    its lm_head tied or not, Gemma 2's soft-capping); below it, the same head on that layer."""
    from transformers import AutoModelForCausalLM

    from layerwise.explore import CausalLMHead, logit_lens

    folder = decoder_folder(arch)
    encoder = lw.Encoder(folder, device="cpu", final_norm=final_norm)
    head = CausalLMHead.load(encoder)
    assert head is not None
    lens = logit_lens(encoder, TEXTS[0], k=3, head=head)
    assert lens["kind"] == "next_token" and len(lens["masks"]) == 1
    assert lens["masks"][0]["position"] == len(lens["tokens"]) - 1
    lm = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = encoder.tokenizer(TEXTS[0], return_tensors="pt")
    with torch.no_grad():
        own = torch.softmax(lm(**ids).logits[0, -1], -1).numpy()
    top = np.argsort(-own)[:3]
    expected = [(encoder.tokenizer.convert_ids_to_tokens(int(i)), float(own[i])) for i in top]
    got = lens["masks"][0]["predictions"][-1]
    assert lens["masks"][0]["pieces"][-1] == [t for t, _ in expected]  # the raw pieces
    assert [t for t, _ in got] == [head.shown_by(t) for t, _ in expected]  # as a person reads them
    np.testing.assert_allclose([p for _, p in got], [p for _, p in expected], atol=1e-5)
    # layer 1 through the same norm and head, computed here from the raw hidden state
    raw = lw.Encoder(folder, device="cpu", final_norm=False).extract(TEXTS[0], layers=[1]).hidden[0, -1]
    with torch.no_grad():
        logits = lm.lm_head(lm.base_model.norm(torch.from_numpy(raw)[None]))[0]
        cap = getattr(lm.config, "final_logit_softcapping", None)
        logits = torch.tanh(logits / cap) * cap if cap else logits
    layer1 = torch.softmax(logits, -1).numpy()
    best = encoder.tokenizer.convert_ids_to_tokens(int(layer1.argmax()))
    assert lens["masks"][0]["pieces"][1][0] == best


def test_attention_maps_of_a_decoder_are_causal(decoder_encoder):
    from layerwise.explore import attention_maps

    stack, maps = attention_maps(decoder_encoder("llama"), TEXTS[0])
    assert maps.shape == (3, 4, stack.n_tokens, stack.n_tokens)
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
    assert np.triu(maps, k=1).max() == 0.0  # no token attends to a later one


# ----------------------------------------------------------------------- a real decoder: SmolLM2 (GGUF)
@needs_smollm2
def test_smollm2_from_its_gguf_file_equals_transformers_own_load(smollm2):
    from transformers import AutoModel

    folder = smollm2_folder()
    assert folder is not None
    (gguf,) = folder.glob("*.gguf")
    assert smollm2.is_decoder and smollm2.n_layers == 30 and smollm2.hidden_size == 576
    assert smollm2.engine.packed is not None  # Llama architecture: the packed forward
    model = AutoModel.from_pretrained(folder, gguf_file=gguf.name).eval()
    stacks = smollm2.extract(TEXTS[:3])
    for text, stack in zip(TEXTS[:3], stacks, strict=True):
        ids = smollm2.tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            expected = torch.stack(model(**ids, output_hidden_states=True).hidden_states)[:, 0].numpy()
        # to 1e-5 of each hidden state's scale: SmolLM2's residual stream reaches 2.4e4 at its first
        # token (the "massive activations" of LLMs), where float32 itself rounds at 2e-3
        scale = np.abs(expected).max(axis=(1, 2), keepdims=True)
        assert (np.abs(stack.hidden - expected) <= 1e-5 * scale).all()
    # the folder holding one .gguf file and no config.json is that file
    from layerwise._model.loading.source import resolve_model_source

    assert resolve_model_source(folder)[0] == resolve_model_source(gguf)[0] == str(gguf) == smollm2.source


@needs_smollm2
def test_smollm2_refuses_words_of_bytes_its_vocabulary_lacks_by_name(smollm2):
    """SmolLM2's byte-level vocabulary has no token for 21 bytes (0x16 among them) and adds no BOS:
    pre-split words made only of them give no tokens, refused by name as texts are (found by
    benchmarks/fuzz_alignment.py); one such word among others keeps its slot."""
    assert {0x04, 0x16, 0xFF} <= bytes_not_in_vocabulary(smollm2.tokenizer)
    check_words(smollm2, ["\x16"])
    check_words(smollm2, ["\x16", "bank"])
    with pytest.raises(InputError, match=r"input 0 \('\\x16'\) gives no tokens"):
        smollm2.extract(words=[["\x16"]])


@needs_smollm2
def test_smollm2_knows_the_capital_of_france_at_its_last_layer(smollm2):
    from layerwise.explore import logit_lens

    lens = logit_lens(smollm2, "The capital of France is", k=3)
    last = lens["masks"][0]["predictions"][-1]
    assert last[0][0] == " Paris", last  # as a person reads it (#46, 23)
    assert lens["masks"][0]["pieces"][-1][0] == "ĠParis"  # the vocabulary's own piece, kept
    first = lens["masks"][0]["predictions"][0]
    assert first[0][0] != " Paris"  # the embeddings alone do not know it
    assert lens["tokens"][-1] == " is" and lens["pieces"][-1] == "Ġis"


@pytest.mark.parametrize("model_process", [False, True])
def test_a_decoder_served_over_http(decoder_encoder, model_process):
    """/v1/embeddings with a relative depth and last-token pooling, /v1/layers, a pair refused with
    a 422, and the explorer's lens reading the next token."""
    pytest.importorskip("fastapi")

    from layerwise.serve import ServeSettings, create_app

    encoder = decoder_encoder("llama")  # the model process loads it again from its folder
    app = create_app({"llama": encoder}, ServeSettings(model_process=model_process))

    async def scenario(c):
        embedded = await c.post(
            "/v1/embeddings", json={"input": TEXTS[:2], "layers": "0.5", "pool": "sentence:last"}
        )
        pair = await c.post("/v1/layers", json={"pairs": [["a", "b"]]})
        models = await c.get("/v1/explore/info")
        lens = await c.post("/v1/explore/lens", json={"model": "llama", "text": "The bank", "k": 2})
        return embedded, pair, models, lens

    embedded, pair, models, lens = run_app(app, scenario)
    assert embedded.status_code == 200, embedded.text
    vectors = np.array([d["embedding"] for d in embedded.json()["data"]], dtype=np.float32)
    np.testing.assert_allclose(vectors, encoder.embed(TEXTS[:2], layers=2, pool="last"), atol=1e-5)
    assert pair.status_code == 422 and "no text pairs" in pair.json()["error"]["message"]
    (info,) = models.json()["models"]
    assert info["decoder"] is True and info["lens"] is True
    assert lens.status_code == 200 and lens.json()["kind"] == "next_token"


@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="needs the gguf extra")
def test_the_gguf_de_quantising_bar_is_silenced_even_after_tqdm_was_imported(capfd):
    """transformers' GGUF reader draws a plain tqdm bar; TQDM_DISABLE is read when tqdm is
    imported, so loading silences that bar itself, and puts it back afterwards."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    from layerwise._model.loading.source import quiet_transformers

    before = gguf_utils.tqdm
    with quiet_transformers(gguf=True):
        list(gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
    assert "de-quantizing" not in capfd.readouterr().err
    assert gguf_utils.tqdm is before


@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="needs the gguf extra")
def test_a_gguf_file_is_parsed_once_while_an_encoder_loads(tmp_path):
    """transformers reads a GGUF file for the config, the tokenizer and the weights; while an
    encoder loads, the first parse serves all three, and gguf's reader is itself again after."""
    import gguf

    from layerwise._model.loading.gguf_files import gguf_read_once

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with gguf_read_once(str(path)):
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first and first.fields["llama.block_count"].contents() == 2
    assert gguf.GGUFReader is gguf.gguf_reader.GGUFReader
    assert gguf.GGUFReader(path) is not first
    with gguf_read_once(str(tmp_path)):  # not a GGUF file: nothing replaced
        assert gguf.GGUFReader is gguf.gguf_reader.GGUFReader


def test_the_analysis_report_of_a_decoder(decoder_folder, decoder_encoder, tmp_path):
    """`layerwise analyze` on a decoder LM: one row per hidden state, and its numbers are those of
    lw.analyze on the same stacks; word-level self-similarity finds the words in ▁-marked tokens."""
    import json

    from typer.testing import CliRunner

    from layerwise.cli import app

    texts = [*TEXTS[:2], *ud_sentences(limit=30)]
    texts += ["The bank raised rates.", "We sat on the bank.", "The bank said no.", "A bank of fog."]
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    folder = str(decoder_folder("llama"))
    args = ["analyze", str(source), "-o", str(tmp_path / "r"), "--model", folder, "--words", "bank", "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    stats = json.loads((tmp_path / "r" / "stats.json").read_text())
    stacks = decoder_encoder("llama").extract(texts, long_texts="window")
    assert stats["layers"] == [0, 1, 2, 3] and stats["n_texts"] == len(texts)
    np.testing.assert_allclose(stats["anisotropy"], lw.analyze.anisotropy(stacks), atol=1e-5)
    np.testing.assert_allclose(stats["cka"], lw.analyze.layer_similarity(stacks, "cka"), atol=1e-5)
    assert len(stats["self_similarity"]["bank"]) == 4
    assert folder in (tmp_path / "r" / "report.html").read_text()


def test_an_input_without_tokens_is_refused_by_name(decoder_encoder):
    """GPT-2's tokenizer adds no BOS: an empty text has no token to embed. An InputError names it
    (in Python, and as a 422 over HTTP), instead of a crash inside the model."""
    pytest.importorskip("fastapi")

    from layerwise.serve import create_app

    encoder = decoder_encoder("gpt2")
    with pytest.raises(InputError, match=r"input 1 \(''\) gives no tokens: .* leave such inputs out"):
        encoder.embed(["fine", ""], pool="last")
    app = create_app({"gpt2": encoder})

    async def post(c):
        return await c.post("/v1/embeddings", json={"input": ["fine", ""], "pool": "sentence:last"})

    answer = run_app(app, post)
    assert answer.status_code == 422, answer.text
    assert "input 1 ('') gives no tokens" in answer.json()["error"]["message"]


@pytest.mark.parametrize("arch", ["llama", "gemma2", "qwen3", "gpt2"])
def test_attn_out_and_mlp_out_taps_equal_hooks_on_transformers_modules(arch, decoder_encoder):
    """The packed forward's attn_out and mlp_out equal forward hooks on the same modules of the
    transformers model run on each text alone; and what the blocks add is the residual step."""
    from layerwise._model.forward.hooks import tap_module

    encoder = decoder_encoder(arch, final_norm=False)
    assert encoder.engine.runs_packed("hidden_states", ("attn_out", "mlp_out"))
    stacks = encoder.extract(TEXTS, layers=[0, 1, 2], taps=["attn_out", "mlp_out"])
    model = encoder.model
    for text, stack in zip(TEXTS, stacks, strict=True):
        assert stack.tap_layers == (1, 2) and stack.taps["attn_out"].shape == (2, stack.n_tokens, 64)
        recorded: dict = {}

        def keep(key, recorded=recorded):
            def hook(module, args, out):
                recorded[key] = (out[0] if isinstance(out, tuple) else out)[0].detach().numpy()

            return hook

        blocks = model.layers if hasattr(model, "layers") else model.h
        handles = [
            tap_module(blocks[i], model.config.model_type, tap).register_forward_hook(keep((tap, i)))
            for tap in ("attn_out", "mlp_out")
            for i in (0, 1)
        ]
        try:
            with torch.no_grad():
                model(input_ids=torch.tensor([encoder.tokenize([text])[0].ids]))
        finally:
            for handle in handles:
                handle.remove()
        for j, i in enumerate((0, 1)):
            for tap in ("attn_out", "mlp_out"):
                np.testing.assert_allclose(stack.taps[tap][j], recorded[(tap, i)], atol=1e-5, rtol=1e-5)
        if arch in ("llama", "qwen3", "gpt2"):  # no norms after the blocks: the stream adds them as they are
            step = stack.hidden[1] + stack.taps["attn_out"][1] + stack.taps["mlp_out"][1]
            np.testing.assert_allclose(stack.hidden[2], step, atol=1e-5)
