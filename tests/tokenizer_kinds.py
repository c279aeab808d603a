"""Tokenizers of the kinds the model families bring, trained here on the committed UD EWT sentences
(a second each) with the normalizer, pre-tokenizer, decoder and template of the real ones:

- byte-level BPE (GPT-NeoX/Pythia, OPT, Phi, OLMo, BART and ModernBERT): ``Ġ`` marks a space. The
  families differ in their template: none (GPT-NeoX, Phi, OLMo), ``</s>`` in front (OPT), ``<s> … </s>``
  (BART), ``[CLS] … [SEP]`` (ModernBERT);
- SentencePiece Unigram with Metaspace (T5, mT5, DeBERTa-v3): ``▁`` marks a space, NFKC first; T5 ends
  every text with ``</s>``, DeBERTa-v3 frames it in ``[CLS] … [SEP]``.

The real files are megabytes (a 50k or 128k vocabulary); these hold a few hundred entries of the
same kinds, which is what word alignment depends on.
"""

from __future__ import annotations

from decoder_models import sentences

VOCAB = 600


def _fast(tokenizer, **special):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=256, **special)


def _framed(tokenizer, ids: dict[str, int], *, second_type: int, **more):
    """``[CLS] $A [SEP]`` (a pair's second text typed ``second_type``), BERT's special tokens."""
    from tokenizers import processors

    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair=f"[CLS] $A [SEP] $B:{second_type} [SEP]:{second_type}",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    return _fast(
        tokenizer, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
        mask_token="[MASK]", **more,
    )  # fmt: skip


def byte_level(template: str):
    """Byte-level BPE with the ``template`` of a family: "neox", "opt", "bart" or "modernbert"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = {
        "neox": ["<|endoftext|>", "<|padding|>"],
        "opt": ["<s>", "<pad>", "</s>", "<unk>"],
        "bart": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        "modernbert": ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"],
    }[template]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, initial_alphabet=alphabet)
    tokenizer.train_from_iterator(sentences(), trainer)
    ids = {token: tokenizer.token_to_id(token) for token in specials}
    if template == "neox":
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
        return _fast(tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|padding|>")
    if template == "opt":  # OPT puts </s> in front of every text, as its BOS
        tokenizer.post_processor = processors.TemplateProcessing(
            single="</s> $A", pair="</s> $A </s> $B", special_tokens=[("</s>", ids["</s>"])]
        )
        return _fast(tokenizer, bos_token="</s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    if template == "bart":
        tokenizer.post_processor = processors.RobertaProcessing(("</s>", ids["</s>"]), ("<s>", ids["<s>"]))
        return _fast(
            tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
            mask_token="<mask>", cls_token="<s>", sep_token="</s>",
        )  # fmt: skip
    return _framed(tokenizer, ids, second_type=0)


def unigram(template: str):
    """SentencePiece Unigram over ``▁``-marked words after NFKC, with the ``template`` of "t5" or
    "deberta" (DeBERTa-v3)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = (
        ["<pad>", "</s>", "<unk>"] if template == "t5" else ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    )
    unk = "<unk>" if template == "t5" else "[UNK]"
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(" {2,}", " ")]  # SentencePiece folds runs of spaces
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=VOCAB, special_tokens=specials, unk_token=unk)
    tokenizer.train_from_iterator(sentences(), trainer)
    ids = {token: tokenizer.token_to_id(token) for token in specials}
    if template == "t5":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", ids["</s>"])]
        )
        return _fast(tokenizer, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    return _framed(tokenizer, ids, second_type=1, bos_token="[CLS]", eos_token="[SEP]")
