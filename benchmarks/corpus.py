"""Benchmark corpora built from Universal Dependencies English EWT (../shared/data/ud_ewt).

A *mixed-length* corpus holds single sentences and whole documents (all sentences of one
``# newdoc``, joined by spaces), shuffled with a fixed seed: the mix real users feed an extractor.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path

UD_EWT = Path(__file__).resolve().parents[2] / "shared" / "data" / "ud_ewt"


def read_documents(split: str = "train") -> list[list[str]]:
    """Sentences grouped by document, in file order."""
    path = UD_EWT / f"en_ewt-ud-{split}.conllu"
    if not path.exists():
        raise SystemExit(f"UD EWT not found at {path}; the benchmarks read ../shared/data/ud_ewt")
    documents: list[list[str]] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("# newdoc"):
                documents.append([])
            elif line.startswith("# text = "):
                if not documents:
                    documents.append([])
                documents[-1].append(line[len("# text = ") :].rstrip("\n"))
    return [d for d in documents if d]


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
