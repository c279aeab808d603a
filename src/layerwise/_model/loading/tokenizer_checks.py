"""Checks that a model's tokenizer belongs to its weights, before any text is encoded.

A tokenizer of another vocabulary gives ids that mean nothing to the model, and nothing fails:
the vectors are simply wrong (cosine 0.15 to the real model's for ids shifted by 2). Three checks
catch what can be caught from the files alone:

- every id fits the embedding table (:func:`check_tokenizer_fits`);
- where a folder carries the fast tokenizer (``tokenizer.json``) and the vocabulary it was made
  from (``vocab.txt`` of WordPiece, ``vocab.json`` of BPE), the two agree, token by token;
- the config's special ids (``pad_token_id``, ``bos_token_id``, ``eos_token_id``), which the model
  was trained with, are special tokens in the tokenizer, not ordinary words.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ...errors import ModelLoadError
from ..families.kinds import is_decoder_config

logger = logging.getLogger("layerwise")


def check_tokenizer_fits(config, tokenizer, name: str, vocab: dict[str, int]) -> None:
    """The tokenizer's ids must index the model's embedding table: a larger vocabulary, or special
    tokens past its end, is an error; a vocabulary of special tokens only, too. A vocabulary far
    smaller than the table is allowed (models pad their tables) but said. ``vocab``: the
    tokenizer's ``get_vocab()`` (with added tokens), read once for both checks (25 ms for 30,000)."""
    rows = int(config.vocab_size)
    specials = {t: tokenizer.convert_tokens_to_ids(t) for t in tokenizer.all_special_tokens}
    outside = sorted((i, t) for t, i in vocab.items() if i >= rows)
    if outside:
        shown = ", ".join(f"{t!r}={i}" for i, t in outside[:5])
        bad_specials = [t for t, i in specials.items() if i is not None and i >= rows]
        what = f" (special tokens among them: {', '.join(bad_specials)})" if bad_specials else ""
        raise ModelLoadError(
            f"model {name!r}: its tokenizer has {len(outside):,} token ids at or past the model's vocab size "
            f"{rows:,}: {shown}{what}. The tokenizer and the weights do not belong together: use the "
            "tokenizer the model was trained with"
        )
    if len(vocab) <= len(specials):
        raise ModelLoadError(
            f"model {name!r}: its tokenizer holds only its {len(vocab)} special tokens, no vocabulary; "
            "every word would be [UNK]. Use the tokenizer files the model was trained with"
        )
    if len(vocab) < 0.9 * rows:
        logger.warning(
            "model %s: the tokenizer has %s tokens for an embedding table of %s rows; if it is not the "
            "tokenizer this model was trained with, the ids mean nothing to the model",
            name,
            f"{len(vocab):,}",
            f"{rows:,}",
        )


def check_tokenizer_files_agree(
    folder: Path, config: Any, tokenizer: Any, name: str, vocab: dict[str, int]
) -> None:
    """``tokenizer.json`` against the vocabulary file beside it, entry by entry, and the special
    tokens' ids against the config; a disagreement is a ModelLoadError naming the files and the
    first entries that differ. Two ids swapped are enough to move a word's vector (cosine 0.84
    for "the bank" with "the" and "bank" swapped), so every entry counts; a token listed twice
    in the vocabulary file may have either line's id (WordPiece keeps one). ``vocab``: as
    :func:`check_tokenizer_fits` takes it."""
    if (folder / "tokenizer.json").is_file():
        for file_name, entries in _vocabulary_files(folder, vocab):
            differ = [
                (t, ids[0], vocab[t]) for t, ids in entries.items() if t in vocab and vocab[t] not in ids
            ]
            if differ:
                shown = "; ".join(
                    f"{t!r}: {i} in {file_name}, {j} in tokenizer.json" for t, i, j in differ[:3]
                )
                raise ModelLoadError(
                    f"model {name!r}: tokenizer.json and {file_name} in {str(folder)!r} give "
                    f"{len(differ):,} of {len(entries):,} tokens different ids ({shown}); they are not the "
                    "same vocabulary, and the ids that differ mean other words to the model. "
                    "Keep the tokenizer files the model was trained with (tokenizer.save_pretrained(folder))"
                )
    # the config's special ids are the ones the model was trained with: in the tokenizer each must be
    # a special (or added) token. An ordinary word there means another vocabulary. (A tokenizer may
    # name another special token than the config, e.g. an instruct model's end-of-turn as eos.)
    special = set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab())
    wrong = []
    # an encoder's forward never sees bos/eos ids (its template does), and configs carry their class
    # defaults for them; its pad id is the embedding table's padding row
    fields = (
        ("pad_token_id", "bos_token_id", "eos_token_id") if is_decoder_config(config) else ("pad_token_id",)
    )
    for field in fields:
        expected = getattr(config, field, None)
        if not isinstance(expected, int) or isinstance(expected, bool) or not 0 <= expected < len(vocab):
            continue
        token = tokenizer.convert_ids_to_tokens(expected)
        if token is not None and token not in special:
            wrong.append(f"config.json's {field} {expected} is {token!r} in the tokenizer, an ordinary token")
    if wrong:
        raise ModelLoadError(
            f"model {name!r} in {str(folder)!r}: the tokenizer does not match config.json "
            f"({'; '.join(wrong)}); "
            "it is not the tokenizer the model was trained with: use its own files"
        )


def _vocabulary_files(folder: Path, vocab: dict[str, int]) -> list[tuple[str, dict[str, tuple[int, ...]]]]:
    """``(file name, {token: ids})`` of WordPiece's ``vocab.txt`` (id = line; a token on several
    lines has several) and BPE's ``vocab.json``; a ``vocab.txt`` whose lines are ``vocab``'s tokens
    in id order (the usual case, compared at C speed) gives no entries to check."""
    found = []
    if (folder / "vocab.txt").is_file():
        text = (folder / "vocab.txt").read_text(encoding="utf-8")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines = lines[:-1]
        keys = [token.rstrip("\r") for token in lines] if "\r" in text else lines
        # ids are distinct, so the first n in id order are 0..n-1 exactly when the n-th is n-1
        in_order = sorted(vocab, key=vocab.__getitem__)
        agree = keys == in_order[: len(keys)] and (not keys or vocab[keys[-1]] == len(keys) - 1)
        if not agree:
            entries: dict[str, tuple[int, ...]] = {key: (i,) for i, key in enumerate(keys)}
            if len(entries) < len(keys):  # a token on several lines has each line's id
                multi: dict[str, list[int]] = {}
                for i, key in enumerate(keys):
                    multi.setdefault(key, []).append(i)
                entries = {key: tuple(ids) for key, ids in multi.items()}
            found.append(("vocab.txt", entries))
    if (folder / "vocab.json").is_file():
        try:
            document = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        except ValueError:
            document = {}
        if isinstance(document, dict):
            found.append(("vocab.json", {t: (i,) for t, i in document.items() if isinstance(i, int)}))
    return found
