"""The view-based label-free metrics (LiDAR, DiME, InfoNCE): each text and seeded augmented copies of
it go through the model, one mean vector per view and hidden state, and the metrics ask how well a
layer keeps the views of one text together and different texts apart.

Augmentations are word-level edits in the spirit of the paper's (NLPAug-style): each word, with
probability 0.1 (and at least one word per view), is deleted, swapped with the next word, split in
two, or has its first two letters swapped. A view depends only on (seed, text, view number), never
on the text's position, and the texts are put in one canonical order (sorted) before any permutation
is drawn: the values do not change with the input order or the batch size. Vectors are centred on
the whole set (every view of every text) and scaled to unit length, once; the paper's code normalises
each mini-batch on its own.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError
from .spectra import alpha_entropy, center_unit, max_entropy

if TYPE_CHECKING:
    from typing import Unpack

    from .sources import TokenPassOptions

EDIT_PROBABILITY = 0.1
SCATTER_RIDGE = 1e-4  # added to LiDAR's within-class scatter, as in the paper's code (delta)


def augment(text: str, *, seed: int, view: int) -> str:
    """One augmented copy of ``text``, a pure function of (seed, text, view). Each word is edited with
    probability 0.1, and at least one word always is: a view never repeats its text."""
    rng = np.random.default_rng([seed, zlib.crc32(text.encode("utf-8")), view])
    words = text.split()
    if not words:
        return text
    chosen = set(np.flatnonzero(rng.random(len(words)) < EDIT_PROBABILITY).tolist())
    if not chosen:
        chosen = {int(rng.integers(len(words)))}
    out: list[str] = []
    k = 0
    while k < len(words):
        word = words[k]
        if k not in chosen:
            out.append(word)
            k += 1
            continue
        edit = int(rng.integers(4))
        if edit == 1 and k + 1 < len(words):  # swap with the next word
            out.extend([words[k + 1], word])
            k += 1
        elif edit == 2 and len(word) > 1:  # split in two
            cut = int(rng.integers(1, len(word)))
            out.extend([word[:cut], word[cut:]])
        elif edit == 3 and len(word) > 1 and word[0] != word[1]:  # two adjacent letters swapped
            out.append(word[1] + word[0] + word[2:])
        elif len(words) > 1:  # deleted (also the fallback when the chosen edit cannot apply)
            pass
        else:
            out.append(word + word[-1])  # a lone word: a letter doubled
        k += 1
    return " ".join(out)


def view_means(
    encoder: Any, texts: Sequence[str], *, views: int, seed: int = 0, **reading: Unpack[TokenPassOptions]
) -> np.ndarray:
    """``(n_texts, views, hidden states, width)`` float32: the mean of every token of each augmented
    view, texts in sorted order. ``views`` forward passes' worth of tokens, in one streaming call."""
    if not hasattr(encoder, "iter_extract"):
        raise InputError("LiDAR, DiME and InfoNCE compare augmented views of each text: pass an Encoder")
    ordered = sorted(texts)
    if len(ordered) < 2 or views < 2:
        raise InputError(
            f"the view metrics need 2 texts or more and 2 views or more (got {len(ordered)}, {views})"
        )
    copies = [augment(text, seed=seed, view=v) for text in ordered for v in range(views)]
    out: np.ndarray | None = None
    for index, stack in encoder.iter_extract(copies, layers="all", **reading):
        if out is None:
            out = np.empty((len(ordered), views, stack.hidden.shape[0], stack.hidden.shape[2]), np.float32)
        out[index // views, index % views] = np.asarray(stack.hidden, dtype=np.float64).mean(axis=1)
    assert out is not None
    return out


def _units(means: np.ndarray) -> np.ndarray:
    """(states, texts, views, width) float64: centred on the whole set, each vector of unit length."""
    n, v, s, d = means.shape
    flat = np.asarray(means, dtype=np.float64).transpose(2, 0, 1, 3).reshape(s, n * v, d)
    return center_unit(flat).reshape(s, n, v, d)


def lidar_of(means: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    """LiDAR per hidden state from view means (texts, views, states, width): each text a class; the
    between-class scatter of the class means about the set's mean, the within-class scatter of the
    views about their class mean plus 1e-4 I; the entropy of the eigenvalues of
    ``W^-1/2 B W^-1/2`` (LiDAR's LDA matrix), normalised by min(ln n_texts, ln width) as in the paper's
    code (LiDAR's own paper reports exp of this entropy, an effective rank)."""
    units = _units(means)
    s, n, v, d = units.shape
    out = np.empty(s)
    for k in range(s):
        z = units[k]
        class_means = z.mean(axis=1)
        spread = class_means - z.reshape(n * v, d).mean(axis=0)
        between = spread.T @ spread / n
        within_rows = (z - class_means[:, None, :]).reshape(n * v, d)
        within = within_rows.T @ within_rows / (n * v) + SCATTER_RIDGE * np.eye(d)
        eigenvalues, vectors = np.linalg.eigh(within)
        root = (vectors / np.sqrt(eigenvalues)) @ vectors.T
        out[k] = alpha_entropy(np.linalg.eigvalsh(root @ between @ root), alpha) / max_entropy(n, d)
    return out


def _joint_entropy(ka: np.ndarray, kb: np.ndarray, alpha: float) -> float:
    joint = ka * kb
    return float(alpha_entropy(np.linalg.eigvalsh(joint / np.trace(joint)), alpha))


def dime_of(means: np.ndarray, *, alpha: float = 1.0, permutations: int = 10, seed: int = 0) -> np.ndarray:
    """DiME per hidden state from two views (texts, 2, states, width): with Ka, Kb the n x n Gram
    matrices of the two views, ``mean_P H(Ka o P Kb P^T) - H(Ka o Kb)`` over ``permutations`` seeded
    random permutations P of the texts (o: elementwise product; H: matrix entropy), normalised by
    min(ln n_texts, ln width). Always the n x n Grams: the paper's code switches to d x d covariances
    when texts outnumber dimensions, where a permutation shuffles features instead of pairing views
    with other texts."""
    units = _units(means[:, :2])
    s, n = units.shape[:2]
    orders = [np.random.default_rng([seed, t]).permutation(n) for t in range(permutations)]
    out = np.empty(s)
    for k in range(s):
        a, b = units[k, :, 0], units[k, :, 1]
        ka, kb = a @ a.T, b @ b.T
        paired = _joint_entropy(ka, kb, alpha)
        shuffled = np.mean([_joint_entropy(ka, kb[np.ix_(p, p)], alpha) for p in orders])
        out[k] = (shuffled - paired) / max_entropy(n, units.shape[-1])
    return out


def infonce_of(means: np.ndarray, *, temperature: float = 0.1) -> np.ndarray:
    """InfoNCE per hidden state from two views (texts, 2, states, width), as the paper's code (after
    solo-learn's SimCLR): both views stacked, similarities ``z_i . z_j / temperature``; for each
    vector, ``-log(e^pos / (e^pos + sum e^neg))`` with pos its other view and neg every vector of
    another text; the mean over all 2n vectors. Lower means the views of a text are easier to match."""
    units = _units(means[:, :2])
    s, n = units.shape[:2]
    text_of = np.concatenate([np.arange(n), np.arange(n)])
    partner = np.concatenate([np.arange(n, 2 * n), np.arange(n)])
    negative = text_of[:, None] != text_of[None, :]
    out = np.empty(s)
    for k in range(s):
        z = np.concatenate([units[k, :, 0], units[k, :, 1]])
        logits = z @ z.T / temperature
        positive = logits[np.arange(2 * n), partner]
        both = np.where(negative, logits, -np.inf)
        both[np.arange(2 * n), partner] = positive
        top = both.max(axis=1, keepdims=True)
        log_denominator = top[:, 0] + np.log(np.exp(both - top).sum(axis=1))
        out[k] = float(np.mean(log_denominator - positive))
    return out
