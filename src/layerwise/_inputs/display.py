"""Tokens as a person reads them: ``'ĠParis'`` is ``' Paris'``, ``'▁Paris'`` is ``' Paris'``.

A vocabulary's pieces are spelt for the tokenizer, not for people: byte-level BPE (GPT-2, Qwen,
SmolLM2) writes each byte as a printable stand-in (``Ġ`` a space, ``Ċ`` a newline, ``Ã©`` the two
bytes of ``é``), SentencePiece writes a space as ``▁`` and unknown bytes as ``<0x0A>``. Decoding a
whole sequence undoes this, but decoding one piece alone drops its leading space in some decoders,
which is exactly what a logit lens or a token table must show. :func:`token_display` maps one piece
to its text with the tokenizer's own decoder type, keeping the space; the raw piece stays available
wherever it is shown (``LayerStack.tokens``, the lens's ``pieces``). WordPiece pieces (``##ing``)
are already readable and stay as they are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_level_table() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte, inverted: stand-in character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    stand_ins, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            stand_ins[chr(byte)] = byte
        else:
            stand_ins[chr(256 + extra)] = byte
            extra += 1
    return stand_ins


def _decoder_types(tokenizer: Any) -> set[str]:
    try:
        decoder = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {}
    except (AttributeError, ValueError):
        return set()
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    return {str(part.get("type")) for part in parts if isinstance(part, dict)}


def token_display(tokenizer: Any) -> Callable[[str], str]:
    """A function from one of ``tokenizer``'s pieces to the text a person reads."""
    kinds = _decoder_types(tokenizer)
    if "ByteLevel" in kinds:
        table = _byte_level_table()

        def byte_level(piece: str) -> str:
            if not piece or any(c not in table for c in piece):
                return piece  # a special or added token, spelt as it is
            return bytes(table[c] for c in piece).decode("utf-8", errors="replace")

        return byte_level
    if "Metaspace" in kinds or "ByteFallback" in kinds or "Replace" in kinds:

        def sentencepiece(piece: str) -> str:
            byte = _BYTE_FALLBACK.fullmatch(piece)
            if byte:
                return bytes([int(byte.group(1), 16)]).decode("utf-8", errors="replace")
            return piece.replace("▁", " ")

        return sentencepiece
    return lambda piece: piece
