"""Tiny random decoder LMs of every family layerwise runs, with real tokenizers, built locally.

Two tokenizers are trained on the committed UD EWT sentences (a second each), so that word
alignment is tested on both kinds decoders use:

- byte-level BPE (GPT-2, Qwen2, SmolLM2): ``Ġ`` marks a space, no BOS;
- SentencePiece-style BPE with byte fallback (Llama, Mistral, Gemma): ``▁`` marks a space, and the
  template adds ``<s>`` in front of every text, as Llama's does.
"""

from __future__ import annotations

from pathlib import Path

from conftest import UD_EWT_DEV

DECODER_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "gpt2")
VOCAB = 600


def sentences() -> list[str]:
    return [s for s in UD_EWT_DEV.read_text(encoding="utf-8").splitlines() if s.strip()]


def byte_level_tokenizer():
    """A GPT-2-style tokenizer: byte-level BPE, ``<|endoftext|>`` as BOS, EOS and padding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet
    )
    tokenizer.train_from_iterator(sentences(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
        unk_token="<|endoftext|>", model_max_length=256,
    )  # fmt: skip


def sentencepiece_tokenizer():
    """A Llama-style tokenizer: BPE over ``▁``-marked words with byte fallback, ``<s>`` prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>", *bytes_])
    tokenizer.train_from_iterator(sentences(), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        model_max_length=256,
    )  # fmt: skip


def decoder_config(arch: str, tokenizer, n_layers: int = 3):
    """A small random config of ``arch`` (grouped-query attention where the family has it)."""
    import transformers as tf

    vocab = len(tokenizer)
    common = dict(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=n_layers, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    if arch == "llama":
        return tf.LlamaConfig(**common, tie_word_embeddings=False)
    if arch == "mistral":
        return tf.MistralConfig(**common, sliding_window=None)
    if arch == "qwen2":
        return tf.Qwen2Config(**common, tie_word_embeddings=True)
    if arch == "qwen3":
        return tf.Qwen3Config(**common, head_dim=16)
    if arch == "gemma":
        return tf.GemmaConfig(**common, head_dim=16)
    if arch == "gemma2":
        return tf.Gemma2Config(**common, head_dim=16, sliding_window=64, query_pre_attn_scalar=16)
    if arch == "gemma3_text":  # local (sliding) and global layers, each with its own rotary base
        return tf.Gemma3TextConfig(**common, head_dim=16, sliding_window=32, query_pre_attn_scalar=16)
    if arch == "gpt2":
        return tf.GPT2Config(
            vocab_size=vocab, n_embd=64, n_layer=n_layers, n_head=4, n_positions=256,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
    raise ValueError(arch)


def save_decoder(arch: str, folder: Path, n_layers: int = 3, seed: int = 0, tokenizer=None) -> Path:
    """A random causal LM of ``arch`` with its tokenizer (by default the family's kind trained
    here; or a given one, e.g. a real model's), saved as a Hugging Face folder."""
    import torch
    from transformers import AutoModelForCausalLM

    if tokenizer is None:
        byte_level = arch in ("gpt2", "qwen2", "qwen3")
        tokenizer = byte_level_tokenizer() if byte_level else sentencepiece_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(decoder_config(arch, tokenizer, n_layers))
    with torch.no_grad():  # some families start their norms at 0 or 1 exactly: make them matter
        for name, parameter in model.named_parameters():
            if "norm" in name or "ln_" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
