"""The files an image or a speech model reads from the command line: which suffixes each modality
takes (images.py, audio.py), the files that folders and globs name, and the corpus they make."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from .audio import AUDIO_SUFFIXES
from .images import IMAGE_SUFFIXES, media_corpus, media_files, names_media

SUFFIXES = {"image": IMAGE_SUFFIXES, "audio": AUDIO_SUFFIXES}
NOUNS = {"image": ("image", "images"), "audio": ("audio file", "audio files")}


def names_files_of(source: str, modality: str) -> bool:
    """Whether the command-line input ``source`` names files of ``modality`` (a file with its
    suffix, a folder, a glob), not a table or a text file."""
    return names_media(source, SUFFIXES[modality])


def files_of(sources: Iterable[str | os.PathLike], modality: str) -> list[str]:
    """The files of ``modality`` that ``sources`` name, in order (folders and globs sorted)."""
    return media_files(sources, SUFFIXES[modality], NOUNS[modality][0])


def corpus_of(sources: list[str], modality: str) -> Any:
    """The corpus of the files of ``modality`` that ``sources`` name: their paths as its texts."""
    return media_corpus(sources, files_of(sources, modality), NOUNS[modality][1])
