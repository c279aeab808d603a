"""Benchmark corpora built from Universal Dependencies English EWT (CC BY-SA 4.0).

The corpus is read from ``benchmarks/data/ud_ewt`` (committed: every train and dev sentence grouped
by document, and the UPOS columns the probe benchmark reads; see its README), or from the folder
named by the environment variable ``LAYERWISE_UD_EWT``: a UD English EWT release
(``en_ewt-ud-*.conllu``) or a folder laid out like the committed one.

A *mixed-length* corpus holds single sentences and whole documents (all sentences of one
``# newdoc``, joined by spaces), shuffled with a fixed seed: the mix real users feed an extractor.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import random
from collections.abc import Iterator
from pathlib import Path

UD_EWT = Path(os.environ.get("LAYERWISE_UD_EWT") or Path(__file__).resolve().parent / "data" / "ud_ewt")


def read_documents(split: str = "train") -> list[list[str]]:
    """Sentences grouped by document, in file order."""
    conllu = UD_EWT / f"en_ewt-ud-{split}.conllu"
    if conllu.exists():
        return conllu_documents(conllu)
    docs = UD_EWT / f"en_ewt-ud-{split}.docs.txt.gz"
    if not docs.exists():
        raise SystemExit(
            f"UD EWT {split} split not found in {UD_EWT} (neither {conllu.name} nor {docs.name}); "
            "set LAYERWISE_UD_EWT to a UD English EWT release folder"
        )
    text = gzip.decompress(docs.read_bytes()).decode("utf-8")
    return [block.split("\n") for block in text.strip("\n").split("\n\n") if block]


def conllu_documents(conllu: Path) -> list[list[str]]:
    """The sentences (``# text``) of a CoNLL-U file grouped by ``# newdoc``, in file order."""
    documents: list[list[str]] = []
    with conllu.open(encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("# newdoc"):
                documents.append([])
            elif line.startswith("# text = "):
                if not documents:
                    documents.append([])
                documents[-1].append(line[len("# text = ") :].rstrip("\n"))
    return [d for d in documents if d]


def upos_conllu(split: str) -> Path:
    """A CoNLL-U file of ``split`` with at least ID, FORM and UPOS (the probe benchmark's input):
    the release's own file, or the committed excerpt, unpacked into a temporary file."""
    import tempfile

    conllu = UD_EWT / f"en_ewt-ud-{split}.conllu"
    if conllu.exists():
        return conllu
    packed = UD_EWT / f"en_ewt-ud-{split}.upos.conllu.gz"
    if not packed.exists():
        raise SystemExit(f"UD EWT {split} split not found in {UD_EWT}; set LAYERWISE_UD_EWT")
    out = Path(tempfile.mkdtemp(prefix="lw-ud-")) / f"en_ewt-ud-{split}.conllu"
    out.write_bytes(gzip.decompress(packed.read_bytes()))
    return out


def mixed_corpus(n_sentences: int, n_documents: int, *, split: str = "train", seed: int = 0) -> list[str]:
    """``n_sentences`` single sentences and ``n_documents`` whole documents (of >= 5 sentences)."""
    rng = random.Random(seed)
    documents = read_documents(split)
    sentences = [s for doc in documents for s in doc]
    long_docs = [" ".join(doc) for doc in documents if len(doc) >= 5]
    corpus = rng.sample(sentences, n_sentences) + rng.sample(long_docs, n_documents)
    rng.shuffle(corpus)
    return corpus


@contextlib.contextmanager
def bert_base_folder() -> Iterator[Path]:
    """A randomly initialised 12-layer ``BertConfig()`` model (BERT-base shapes, seed 0) with the
    default model's WordPiece tokenizer, in a temporary folder removed afterwards."""
    import shutil
    import tempfile

    import torch
    from transformers import BertConfig, BertModel
    from transformers.utils import logging as hf_logging

    import layerwise as lw

    hf_logging.disable_progress_bar()
    folder = Path(tempfile.mkdtemp(prefix="lw-bert-base-"))
    try:
        torch.manual_seed(0)
        BertModel(BertConfig()).save_pretrained(folder)
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            shutil.copy(lw.default_model_path() / name, folder / name)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
