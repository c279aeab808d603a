"""What a caller passes as input, checked and brought into one form (:class:`RawInputs`) before any
tokenising: texts (with an optional second segment each), ``(first, second)`` pairs, or pre-split
words. Each bad item is refused by name and index (a non-string, a lone surrogate, an empty word),
and any iterable of strings is taken (a pandas or polars Series, a NumPy or pyarrow array, a
generator); encoding.py tokenises what comes out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InputError


def _check_str(value: object, what: str, index: int) -> str:
    if not isinstance(value, str):
        raise InputError(
            f"{what} is {type(value).__name__} ({value!r:.60}), expected str; "
            "convert it with str() or drop it",
            index=index,
        )
    position = lone_surrogate(value)
    if position is not None:
        raise InputError(
            f"{what} holds the lone surrogate U+{ord(value[position]):04X} at character {position}, which "
            "is not valid Unicode; repair it, e.g. text.encode('utf-8', 'replace').decode()",
            index=index,
        )
    return value


def as_texts(values: object, name: str = "texts") -> list:
    """``values`` as a list, from any iterable of strings: a list or tuple, a pandas or polars
    Series, a NumPy array, a pyarrow Array or ChunkedArray (through ``to_pylist``, so that nulls
    become None and are refused by name), a generator. A single string is refused: wrap it in a
    list. The items are checked later (normalize_inputs), each naming its index."""
    if isinstance(values, str | bytes):
        raise InputError(f"{name} must be a list of strings; wrap a single text in a list")
    if isinstance(values, list):
        return values
    to_pylist = getattr(values, "to_pylist", None)  # pyarrow: items would be scalars, not str
    if callable(to_pylist):
        return list(to_pylist())
    try:
        return list(values)  # type: ignore[call-overload]
    except TypeError:
        raise InputError(f"{name} must be an iterable of strings, not {type(values).__name__}") from None


def lone_surrogate(text: str) -> int | None:
    """Position of the first lone surrogate in ``text`` (not text: a broken "\ud800" escape,
    often), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _check_words(value: object, index: int) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InputError(
            f"words[{index}] is {type(value).__name__}, expected a list of words such as "
            "['Pre', 'split', 'words']; pass raw strings with texts= instead",
            index=index,
        )
    words = tuple(value)
    for j, word in enumerate(words):
        _check_str(word, f"words[{index}][{j}]", index)
        if not word:  # (a whitespace-only word is kept: it gets a zero vector, like "\u200b")
            raise InputError(
                f"words[{index}][{j}] is {word!r}: an empty word is most often a parsing slip (a doubled "
                "separator); remove it, or pass a placeholder such as '_'",
                index=index,
            )
    return words


@dataclass(frozen=True, slots=True)
class RawInputs:
    """Validated input in one of the three forms."""

    texts: list[str]
    text_pairs: list[str] | None
    words: list[tuple[str, ...]] | None
    field: str = "texts"  # the argument they came in as: texts, pairs or words (for messages)

    def __len__(self) -> int:
        return len(self.texts)


def normalize_inputs(
    texts: Sequence[str] | None = None,
    *,
    text_pairs: Sequence[str] | None = None,
    pairs: Sequence[tuple[str, str]] | None = None,
    words: Sequence[Sequence[str]] | None = None,
) -> RawInputs:
    """Check the inputs and bring them into one form. Exactly one of ``texts``, ``pairs`` and
    ``words`` must be given; ``text_pairs`` only together with ``texts``."""
    if text_pairs is not None and texts is None:
        raise InputError("text_pairs= needs texts= with one first segment per pair")
    given = [name for name, v in (("texts", texts), ("pairs", pairs), ("words", words)) if v is not None]
    if len(given) != 1:
        raise InputError(f"pass exactly one of texts=, pairs= or words= (got {', '.join(given) or 'none'})")
    if texts is not None:
        checked = [_check_str(t, f"texts[{i}]", i) for i, t in enumerate(as_texts(texts))]
        seconds = None
        if text_pairs is not None:
            if isinstance(text_pairs, str):
                raise InputError("text_pairs must be a list of strings, one per text")
            text_pairs = as_texts(text_pairs, "text_pairs")
            if len(text_pairs) != len(checked):
                raise InputError(
                    f"texts has {len(checked)} items but text_pairs has {len(text_pairs)}; "
                    "pass exactly one second segment per text"
                )
            seconds = [_check_str(t, f"text_pairs[{i}]", i) for i, t in enumerate(text_pairs)]
        return RawInputs(checked, seconds, None)
    if pairs is not None:
        firsts, seconds = [], []
        for i, pair in enumerate(pairs):
            if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2:
                size = len(pair) if isinstance(pair, Sequence) and not isinstance(pair, str) else "not a pair"
                raise InputError(
                    f"pairs[{i}] must be a (first, second) tuple of two strings, got {pair!r:.80} "
                    f"({size} items)",
                    index=i,
                )
            firsts.append(_check_str(pair[0], f"pairs[{i}][0]", i))
            seconds.append(_check_str(pair[1], f"pairs[{i}][1]", i))
        return RawInputs(firsts, seconds, None, "pairs")
    assert words is not None
    if isinstance(words, str):
        raise InputError("words must be a list of word lists, e.g. [['Pre', 'split', 'words']]")
    word_lists = [_check_words(w, i) for i, w in enumerate(words)]
    return RawInputs([" ".join(w) for w in word_lists], None, word_lists, "words")
