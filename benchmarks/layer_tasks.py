"""The labelled tasks of the "which layer?" benchmark (label_free_layers.py), all built from the UD
English EWT excerpts shipped in benchmarks/data (CC BY-SA 4.0), each scored per hidden state:

    similarity  sentence pairs scored 2 (neighbours), 1 (same document), 0 (other documents):
                Spearman of the cosine of the two sentence vectors (decoder_layers.document_pairs)
    genre       a sentence's genre (answers, email, newsgroup, reviews, weblog; from its sent_id):
                5-fold accuracy of a logistic regression on the sentence vectors
    document    which of the 20 longest dev documents a sentence comes from: 5-fold accuracy
    retrieval   each of 500 sentences retrieves the sentence that follows it in its document among
                the 500 followers: mean reciprocal rank of the cosine ranking
    upos        a linear probe of each layer's words for their UPOS tag (lw.probe, accuracy)

The four sentence tasks are scored for every pooling the model is benchmarked with (mean for all,
and the last token for decoders), all from one forward pass over their texts.
"""

from __future__ import annotations

import gzip
import random
from dataclasses import dataclass

import numpy as np
from common import UD_EWT, read_documents, upos_conllu
from decoder_layers import document_pairs

SENTENCE_TASKS = ("similarity", "genre", "document", "retrieval")


@dataclass(frozen=True)
class TaskData:
    pairs: list[tuple[str, str, int]]
    genre_texts: list[str]
    genres: np.ndarray
    document_texts: list[str]
    documents: np.ndarray
    queries: list[str]
    followers: list[str]

    def texts(self) -> list[str]:
        """Every sentence the tasks need, once each."""
        seen: dict[str, None] = {}
        for a, b, _ in self.pairs:
            seen[a] = seen[b] = None
        for text in [*self.genre_texts, *self.document_texts, *self.queries, *self.followers]:
            seen[text] = None
        return list(seen)


def task_data(n_pairs: int = 600, n_genre: int = 1000, n_retrieval: int = 500) -> TaskData:
    genre_pool = [(text, sent_id.split("-")[0]) for sent_id, text in dev_sentences_with_ids()
                  if len(text.split()) >= 3]  # fmt: skip
    genre_pool = random.Random(1).sample(genre_pool, n_genre)
    names = sorted({genre for _, genre in genre_pool})
    documents = [[s for s in doc if len(s.split()) >= 5] for doc in read_documents("dev")]
    longest = sorted(documents, key=len, reverse=True)[:20]
    followers = [(doc[i], doc[i + 1]) for doc in documents for i in range(len(doc) - 1)]
    followers = [pair for pair in followers if pair[0] != pair[1]]
    followers = random.Random(2).sample(followers, n_retrieval)
    return TaskData(
        pairs=document_pairs(n_pairs),
        genre_texts=[text for text, _ in genre_pool],
        genres=np.array([names.index(genre) for _, genre in genre_pool]),
        document_texts=[s for doc in longest for s in doc],
        documents=np.array([k for k, doc in enumerate(longest) for _ in doc]),
        queries=[q for q, _ in followers],
        followers=[f for _, f in followers],
    )


def dev_sentences_with_ids() -> list[tuple[str, str]]:
    """(sent_id, text) of every dev sentence of the shipped CoNLL-U excerpt."""
    lines = (
        gzip.decompress((UD_EWT / "en_ewt-ud-dev.upos.conllu.gz").read_bytes()).decode("utf-8").split("\n")
    )
    out, sent_id = [], None
    for line in lines:
        if line.startswith("# sent_id = "):
            sent_id = line[len("# sent_id = ") :]
        elif line.startswith("# text = ") and sent_id:
            out.append((sent_id, line[len("# text = ") :]))
    return out


def sentence_vectors(encoder, texts: list[str], pools: tuple[str, ...]) -> dict[str, dict[str, np.ndarray]]:
    """``{pool: {text: (hidden states, width)}}`` from one streaming pass over ``texts``: "mean" is
    the mean of every token's states (special tokens included, as ``embed``'s default), "last" the
    last token's."""
    out: dict[str, dict[str, np.ndarray]] = {pool: {} for pool in pools}
    for index, stack in encoder.iter_extract(texts, layers="all", progress=False):  # in any order
        text = texts[index]
        hidden = np.asarray(stack.hidden, dtype=np.float32)  # (states, tokens, width)
        if "mean" in out:
            out["mean"][text] = hidden.mean(axis=1)
        if "last" in out:
            out["last"][text] = hidden[:, -1].copy()
    return out


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of (n, states, width) arrays: (n, states)."""
    a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return np.einsum("nsd,nsd->ns", a, b)


def similarity(vectors: dict[str, np.ndarray], data: TaskData) -> list[float]:
    from scipy.stats import spearmanr

    a = np.stack([vectors[x] for x, _, _ in data.pairs])
    b = np.stack([vectors[y] for _, y, _ in data.pairs])
    gold = np.array([score for _, _, score in data.pairs], dtype=float)
    cosines = _cosine(a, b)
    return [float(spearmanr(cosines[:, k], gold).statistic) for k in range(cosines.shape[1])]


def classification(vectors: dict[str, np.ndarray], texts: list[str], labels: np.ndarray) -> list[float]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.stack([vectors[t] for t in texts])  # (texts, states, width)
    folds = StratifiedKFold(5, shuffle=True, random_state=0)
    scores = []
    for k in range(x.shape[1]):
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=0.1))
        scores.append(float(cross_val_score(model, x[:, k], labels, cv=folds, n_jobs=2).mean()))
    return scores


def retrieval(vectors: dict[str, np.ndarray], data: TaskData) -> list[float]:
    q = np.stack([vectors[t] for t in data.queries]).transpose(1, 0, 2)  # (states, n, width)
    f = np.stack([vectors[t] for t in data.followers]).transpose(1, 0, 2)
    q = q / np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-12)
    f = f / np.maximum(np.linalg.norm(f, axis=-1, keepdims=True), 1e-12)
    sims = np.einsum("snd,smd->snm", q, f)  # (states, queries, followers)
    own = np.diagonal(sims, axis1=1, axis2=2)[..., None]
    # a tie shares its ranks: identical vectors (every follower's last token "." at hidden state 0)
    # must not all rank first
    ranks = 1 + (sims > own).sum(axis=2) + ((sims == own).sum(axis=2) - 1) / 2
    return [float(v) for v in (1.0 / ranks).mean(axis=1)]


def sentence_scores(encoder, data: TaskData, pools: tuple[str, ...]) -> dict[str, dict[str, list[float]]]:
    """``{task: {pool: score per hidden state}}`` for the four sentence tasks."""
    by_pool = sentence_vectors(encoder, data.texts(), pools)
    out: dict[str, dict[str, list[float]]] = {task: {} for task in SENTENCE_TASKS}
    for pool, vectors in by_pool.items():
        out["similarity"][pool] = similarity(vectors, data)
        out["genre"][pool] = classification(vectors, data.genre_texts, data.genres)
        out["document"][pool] = classification(vectors, data.document_texts, data.documents)
        out["retrieval"][pool] = retrieval(vectors, data)
    return out


def upos_scores(encoder, max_train: int = 1000, max_dev: int = 500) -> list[float]:
    import layerwise as lw

    result = lw.probe("conllu", train=upos_conllu("train"), dev=upos_conllu("dev"), column="upos", encoder=encoder,
                      max_train=max_train, max_dev=max_dev, fuses=(), controls=(), scalar_mix=False,
                      progress=False)  # fmt: skip
    return [row.score for row in result.layer_rows()]
