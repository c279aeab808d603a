"""Tiny random models of families beyond the BERT and Llama ones, each with a tokenizer of its kind
(tokenizer_kinds.py), saved as the checkpoint of the head model the family is published with (a
causal LM, a masked LM, a sequence-to-sequence LM), so that its weights carry the real prefixes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizer_kinds import byte_level, unigram

SIZE = dict(
    hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
    max_position_embeddings=256,
)  # fmt: skip
SEQ2SEQ = dict(d_model=64, num_layers=3, num_heads=4, d_ff=128, d_kv=16, num_decoder_layers=2)
BART = dict(
    d_model=64, encoder_layers=3, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=256,
)  # fmt: skip

# model type -> (tokenizer kind, config fields beyond SIZE, head the checkpoint is saved with)
FAMILIES: dict[str, tuple[tuple[str, str], dict[str, Any], str]] = {
    # decoders the packed forward runs (forward/packed_decoder.py)
    "gpt_neox": (("byte_level", "neox"), dict(rotary_pct=0.25, use_parallel_residual=True), "causal"),
    "opt": (("byte_level", "opt"), dict(ffn_dim=128, word_embed_proj_dim=64), "causal"),
    "phi": (("byte_level", "neox"), dict(partial_rotary_factor=0.5), "causal"),
    "phi3": (("byte_level", "neox"), dict(num_key_value_heads=2), "causal"),
    "olmo": (("byte_level", "neox"), dict(), "causal"),
    "olmo2": (("byte_level", "neox"), dict(num_key_value_heads=2), "causal"),
    # decoders on the general path
    "falcon": (("byte_level", "neox"), dict(new_decoder_architecture=True, num_kv_heads=2), "causal"),
    "bloom": (("byte_level", "neox"), dict(n_head=4), "causal"),
    "gptj": (("byte_level", "neox"), dict(n_embd=64, n_layer=3, n_head=4, rotary_dim=8), "causal"),
    "stablelm": (("byte_level", "neox"), dict(num_key_value_heads=2), "causal"),
    "starcoder2": (("byte_level", "neox"), dict(num_key_value_heads=2), "causal"),
    "granite": (("byte_level", "neox"), dict(num_key_value_heads=2, residual_multiplier=0.5), "causal"),
    "gpt_bigcode": (("byte_level", "neox"), dict(multi_query=True), "causal"),
    "mixtral": (
        ("byte_level", "neox"),
        dict(num_local_experts=4, num_experts_per_tok=2, num_key_value_heads=2),
        "causal",
    ),
    "qwen2_moe": (
        ("byte_level", "neox"),
        dict(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_key_value_heads=2,
        ),
        "causal",
    ),
    # encoders
    "modernbert": (
        ("byte_level", "modernbert"),
        dict(global_attn_every_n_layers=2, local_attention=8),
        "masked",
    ),
    "deberta-v2": (
        ("unigram", "deberta"),
        dict(
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            position_buckets=32,
            max_relative_positions=-1,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            position_biased_input=False,
            type_vocab_size=0,
        ),
        "masked",
    ),
    # encoder-decoders: their encoder runs
    "t5": (("unigram", "t5"), SEQ2SEQ, "seq2seq"),
    "mt5": (("unigram", "t5"), SEQ2SEQ, "seq2seq"),
    "bart": (("byte_level", "bart"), BART, "seq2seq"),
}


def tokenizer_of(model_type: str):
    (kind, template), _, _ = FAMILIES[model_type]
    return byte_level(template) if kind == "byte_level" else unigram(template)


def tiny_config(model_type: str, tokenizer):
    from transformers import CONFIG_MAPPING

    _, fields, head = FAMILIES[model_type]
    given = {**({} if head == "seq2seq" else SIZE), **fields, "vocab_size": len(tokenizer)}
    defaults = CONFIG_MAPPING[model_type]()
    for special in ("pad", "bos", "eos", "cls", "sep"):
        token_id = getattr(tokenizer, f"{special}_token_id")
        if token_id is not None and (
            special in ("pad", "bos", "eos") or hasattr(defaults, f"{special}_token_id")
        ):
            given[f"{special}_token_id"] = token_id
    if head == "seq2seq":
        given["decoder_start_token_id"] = tokenizer.pad_token_id
    # through the config's own constructor (it derives layer types, key-value heads … from these),
    # each field under its own name (GPT-J's n_embd for hidden_size)
    aliases = getattr(CONFIG_MAPPING[model_type], "attribute_map", {})
    return CONFIG_MAPPING[model_type](**{aliases.get(k, k): v for k, v in given.items()})


def save_family(model_type: str, folder: Path, seed: int = 0) -> Path:
    """A random model of ``model_type`` with its tokenizer kind, saved as a Hugging Face folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    tokenizer = tokenizer_of(model_type)
    config = tiny_config(model_type, tokenizer)
    head = FAMILIES[model_type][2]
    auto = {"causal": AutoModelForCausalLM, "masked": AutoModelForMaskedLM, "seq2seq": AutoModelForSeq2SeqLM}
    torch.manual_seed(seed)
    return save_with_norms_moved(auto[head].from_config(config), tokenizer, folder)


def save_with_norms_moved(model, tokenizer, folder: Path) -> Path:
    """``model`` (its norms moved off their initial 0 or 1, so that they matter) and ``tokenizer``,
    saved as a Hugging Face folder."""
    import torch

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name.lower() or "ln_" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
