"""The pretraining data: documents (one sentence per line, a blank line between documents), a
WordPiece vocabulary trained on them, sentence-pair examples for next-sentence prediction, the
masking of masked LM and the padded batches (pretrain.py trains on them)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def read_documents(path: str | Path) -> list[list[str]]:
    """Documents as lists of sentences: one sentence per line, blank lines between documents."""
    from .._inputs.readers import read_lines

    lines = read_lines(Path(path), what="corpus", option_hint=False)
    documents: list[list[str]] = [[]]
    for line in lines:
        if line.strip():
            documents[-1].append(line.strip())
        elif documents[-1]:
            documents.append([])
    documents = [d for d in documents if d]
    if len(documents) < 2:
        raise InputError(
            f"{path} holds {len(documents)} document(s); next-sentence prediction needs at least two. "
            "Write one sentence per line and a blank line between documents."
        )
    return documents


def train_wordpiece(documents: list[list[str]], vocab_size: int, lowercase: bool = True):
    """A BERT WordPiece tokenizer trained on the corpus (tokenizers library)."""
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(lowercase=lowercase, strip_accents=lowercase)
    tokenizer.train_from_iterator(
        (s for d in documents for s in d),
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
    )
    from tokenizers.processors import TemplateProcessing

    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    # [CLS] A [SEP] B [SEP] with segment ids 0 then 1, as BERT's tokenizer.json has it
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tokenizer


@dataclass(frozen=True)
class Example:
    first: list[int]
    second: list[int]
    is_next: int


def build_examples(encoded: list[list[list[int]]], max_tokens: int, rng: random.Random) -> list[Example]:
    """Sentence-pair examples: segment A = one or more consecutive sentences, B = what follows
    (is_next=1) or text from a random other document (is_next=0), each half of the time."""
    examples = []
    budget = max_tokens - 3  # [CLS] A [SEP] B [SEP]
    for d, document in enumerate(encoded):
        i = 0
        while i < len(document) - 1:
            split = rng.randint(i + 1, min(i + 3, len(document) - 1))
            first = [t for s in document[i:split] for t in s]
            if rng.random() < 0.5:
                second, is_next = [t for s in document[split : split + 2] for t in s], 1
            else:
                other = rng.choice([k for k in range(len(encoded)) if k != d])
                start = rng.randrange(len(encoded[other]))
                second, is_next = [t for s in encoded[other][start : start + 2] for t in s], 0
            while len(first) + len(second) > budget:  # truncate the longer segment, as BERT does
                (first if len(first) > len(second) else second).pop()
            if first and second:
                examples.append(Example(first, second, is_next))
            i = split
    return examples


def mask_tokens(
    ids: torch.Tensor,
    special: torch.Tensor,
    mask_id: int,
    vocab_size: int,
    n_special: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: 15 % of real tokens chosen; 80 % -> [MASK], 10 % -> random, 10 % kept.
    Returns (masked ids, chosen positions)."""
    candidates = ~special
    chosen = (torch.rand(ids.shape, generator=generator) < 0.15) & candidates
    # every example gets at least one prediction
    empty = ~chosen.any(1)
    if empty.any():
        scores = torch.rand(ids.shape, generator=generator).masked_fill(~candidates, -1)
        first = scores.argmax(1)
        chosen[empty, first[empty]] = True
    roll = torch.rand(ids.shape, generator=generator)
    masked = ids.clone()
    masked[chosen & (roll < 0.8)] = mask_id
    random_tokens = torch.randint(n_special, vocab_size, ids.shape, generator=generator)
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    masked[swap] = random_tokens[swap]
    return masked, chosen


def collate(examples: list[Example], cls_id: int, sep_id: int, pad_id: int):
    width = max(len(e.first) + len(e.second) + 3 for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    types = torch.zeros_like(ids)
    special = torch.ones_like(ids, dtype=torch.bool)
    for row, e in enumerate(examples):
        seq = [cls_id, *e.first, sep_id, *e.second, sep_id]
        ids[row, : len(seq)] = torch.tensor(seq)
        types[row, len(e.first) + 2 : len(seq)] = 1
        special[row, 1 : len(e.first) + 1] = False
        special[row, len(e.first) + 2 : len(seq) - 1] = False
    mask = (ids != pad_id).long()
    labels = torch.tensor([e.is_next for e in examples])
    return ids, types, mask, special, labels
