"""The arithmetic of the label-free layer metrics (see label_free.py), on plain float64 arrays, with
a leading axis for the hidden states so that one NumPy call serves every layer of a text.

    center_unit          rows centred on their mean, then each scaled to unit length
    matrix_entropy       matrix-based alpha-Renyi entropy of a set of row vectors (Giraldo et al. 2014)
    alpha_entropy        the same, from eigenvalues
    curvature_of         mean angle between consecutive differences of a trajectory (absolute cosine)
    two_nn              TwoNN intrinsic dimension (Facco et al. 2017), as dadapy's compute_id_2NN
"""

from __future__ import annotations

import math

import numpy as np


def center_unit(x: np.ndarray) -> np.ndarray:
    """``x`` (..., n, d) with its rows centred on their mean and scaled to unit length (a row that is
    zero after centring stays zero). The paper's code applies this to each text's tokens."""
    centred = x - x.mean(axis=-2, keepdims=True)
    norms = np.linalg.norm(centred, axis=-1, keepdims=True)
    return np.divide(centred, norms, out=np.zeros_like(centred), where=norms > 0)


def alpha_entropy(eigenvalues: np.ndarray, alpha: float) -> np.ndarray:
    """alpha-Renyi entropy (nats) of eigenvalues (..., n): the positive ones, renormalised to sum 1,
    as representation-itl's ``matrixAlphaEntropy`` takes them. alpha = 1 is von Neumann's
    ``-sum p ln p``; otherwise ``ln(sum p^alpha) / (1 - alpha)``. NaN where no eigenvalue is positive."""
    values = np.where(eigenvalues > 0, eigenvalues, 0.0)
    total = values.sum(axis=-1, keepdims=True)
    p = np.divide(values, total, out=np.zeros_like(values), where=total > 0)
    positive = p > 0
    logs = np.log(p, out=np.zeros_like(p), where=positive)
    if alpha == 1:
        entropy = -np.sum(p * logs, axis=-1)
    else:
        powered = np.exp(alpha * logs, out=np.zeros_like(p), where=positive)
        entropy = np.log(np.sum(powered, axis=-1)) / (1.0 - alpha)
    return np.where(total[..., 0] > 0, entropy, np.nan)


def gram_eigenvalues(x: np.ndarray, *, clamp: bool = True) -> np.ndarray:
    """Eigenvalues of the Gram matrix ``x x^T`` of rows x (..., n, d), or of its d x d dual ``x^T x``
    when rows outnumber dimensions (the same non-zero spectrum, a smaller matrix), as the paper's
    ``compute_entropy`` chooses. ``clamp``: negative entries set to 0 first, as the paper's code does
    (the clamp acts on whichever matrix was built, so it is kept with the same choice)."""
    n, d = x.shape[-2:]
    gram = np.swapaxes(x, -1, -2) @ x if n > d else x @ np.swapaxes(x, -1, -2)
    if clamp:
        gram = np.maximum(gram, 0.0)
    trace = np.trace(gram, axis1=-2, axis2=-1)[..., None, None]
    gram = np.divide(gram, trace, out=np.zeros_like(gram), where=trace > 0)
    return np.linalg.eigvalsh(gram)


def matrix_entropy(x: np.ndarray, alpha: float = 1.0, *, clamp: bool = True) -> np.ndarray:
    """Matrix-based alpha-Renyi entropy of the rows of x (..., n, d): :func:`alpha_entropy` of the
    trace-normalised Gram matrix. n orthonormal rows give ln n."""
    return alpha_entropy(gram_eigenvalues(np.asarray(x, dtype=np.float64), clamp=clamp), alpha)


def max_entropy(n: int, d: int) -> float:
    """The paper's normaliser ("maxEntropy"): the largest entropy n vectors in d dimensions can have."""
    return min(math.log(n), math.log(d)) if min(n, d) > 1 else float("nan")


def curvature_of(x: np.ndarray) -> np.ndarray:
    """Mean curvature of trajectories x (..., n, d) through their n points: the angle between each
    difference v_k = x_{k+1} - x_k and the next, ``arccos(|v_k . v_{k+1}| / (|v_k| |v_{k+1}|))`` with the
    paper's absolute value (so angles lie in [0, pi/2]), averaged over the n - 2 pairs. A pair with a
    zero difference counts as 0, as the paper's code counts it. NaN where n < 3."""
    n = x.shape[-2]
    if n < 3:
        return np.full(x.shape[:-2], np.nan)
    v = np.diff(x, axis=-2)
    a, b = v[..., :-1, :], v[..., 1:, :]
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    dots = np.abs(np.sum(a * b, axis=-1))
    cosine = np.divide(dots, norms, out=np.ones_like(dots), where=norms > 0)
    angles = np.where(norms > 0, np.arccos(np.clip(cosine, -1.0, 1.0)), 0.0)
    return angles.mean(axis=-1)


def two_nn(x: np.ndarray, *, fraction: float = 0.9) -> float:
    """TwoNN intrinsic dimension of the rows of x (n, d) (Facco et al. 2017): mu_i = r2/r1, the
    ratio of each point's second and first neighbour distances; the smallest ``fraction`` of the
    sorted ln mu_i regressed through the origin against -ln(1 - i/n), i = 1.., as dadapy's
    ``compute_id_2NN`` does. Repeated rows count once (dadapy's ``remove_identical_points``): a
    decoder's embeddings repeat for a repeated token. NaN below 3 distinct points."""
    return float(two_nn_states(np.asarray(x)[None], fraction=fraction)[0])


def two_nn_states(x: np.ndarray, *, fraction: float = 0.9) -> np.ndarray:
    """:func:`two_nn` of each of ``x``'s leading entries (states, n, d), with one batched distance
    computation for all of them."""
    x = np.asarray(x, dtype=np.float64)
    states, n = x.shape[:2]
    squared = np.sum(x * x, axis=-1)
    d2 = np.maximum(squared[:, :, None] + squared[:, None, :] - 2.0 * (x @ np.swapaxes(x, -1, -2)), 0.0)
    d2[:, np.arange(n), np.arange(n)] = np.inf
    repeated = np.zeros((states, n), dtype=bool)  # a later copy of an earlier row: left out
    tiny = 1e-9 * max(1.0, float(squared.max(initial=0.0)))  # candidates, checked for equality below
    for s, i, j in np.argwhere(d2 <= tiny):
        if i < j and not repeated[s, i] and np.array_equal(x[s, i], x[s, j]):
            repeated[s, j] = True
    d2[repeated[:, :, None] | repeated[:, None, :]] = np.inf
    nearest = np.sort(np.partition(d2, min(1, n - 1), axis=-1)[..., :2], axis=-1) if n >= 2 else None
    out = np.full(states, np.nan)
    for s in range(states):
        kept = ~repeated[s]
        if nearest is None or kept.sum() < 3:
            continue
        r1, r2 = nearest[s, kept, 0], nearest[s, kept, 1]
        if not np.all(r1 > 0):  # distinct rows closer than rounding can tell apart
            continue
        mus = np.sqrt(r2 / r1)
        m = mus.shape[0]
        n_fit = int(m * fraction)
        if n_fit < 2:
            continue
        log_mu = np.sort(np.log(mus))[:n_fit]
        y = -np.log(1.0 - np.arange(1, n_fit + 1) / m)
        denominator = float(log_mu @ log_mu)
        out[s] = float(log_mu @ y / denominator) if denominator > 0 else np.nan
    return out
