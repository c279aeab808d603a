"""Linear probes on frozen features: logistic regression, the scalar-mix probe, control labels."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def require_sklearn() -> None:
    from .._settings.extras import require

    require("probe")


def standardize(train: np.ndarray, dev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = train.mean(axis=0, dtype=np.float64)
    std = train.std(axis=0, dtype=np.float64)
    std[std == 0] = 1.0
    return ((train - mean) / std).astype(np.float32), ((dev - mean) / std).astype(np.float32)


def fit_predict(
    x_train: np.ndarray, y_train: np.ndarray, x_dev: np.ndarray, *, seed: int, max_iter: int = 100
) -> np.ndarray:
    """Multinomial logistic regression (L-BFGS, at most ``max_iter`` iterations: dev accuracy
    settles by 50 on UD EWT) on standardised features; dev predictions."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits  # a dependency of scikit-learn

    if len(np.unique(y_train)) < 2:
        return np.full(len(x_dev), y_train[0])
    a, b = standardize(x_train, x_dev)
    model = LogisticRegression(max_iter=max_iter, C=1.0, random_state=seed)
    # L-BFGS makes a hundred small matrix products: threaded BLAS spends more on waking its threads
    # (and on contending with torch's) than it gains; one thread fits 2.4x faster on 2 cores, and the
    # result no longer depends on the machine's thread count
    with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="blas"):
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(a, y_train)
    return model.predict(b)


def scalar_mix_probe(
    train: np.ndarray, y_train: np.ndarray, dev: np.ndarray, *, n_classes: int, seed: int, epochs: int = 300
) -> tuple[np.ndarray, np.ndarray]:
    """Train ScalarMix + linear softmax on ``(n_layers, n, dim)`` features; (dev predictions, weights)."""
    import torch

    from .._features.scalar_mix import ScalarMix

    torch.manual_seed(seed)
    layers = train.shape[0]
    a = np.empty_like(train)
    b = np.empty_like(dev)
    for k in range(layers):
        a[k], b[k] = standardize(train[k], dev[k])
    xa, xb = torch.from_numpy(a), torch.from_numpy(b)
    ya = torch.from_numpy(y_train.astype(np.int64))
    mix = ScalarMix(layers)
    head = torch.nn.Linear(train.shape[2], n_classes)
    optimizer = torch.optim.Adam([*mix.parameters(), *head.parameters()], lr=0.05, weight_decay=0.0)
    for _ in range(epochs):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(head(mix(xa)), ya)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        predictions = head(mix(xb)).argmax(-1).numpy()
    return predictions, mix.normalized_weights().detach().numpy()


def control_labels(
    words: Sequence[Sequence[str]], labels: Sequence[Sequence[str]], all_words, seed: int
) -> dict[str, str]:
    """Hewitt & Liang's control task: each word type (lower-cased) gets a label drawn from the
    empirical label distribution, fixed by ``seed``."""
    values, counts = np.unique([label for sentence in labels for label in sentence], return_counts=True)
    types = sorted({w.lower() for sentence in all_words for w in sentence})
    rng = np.random.default_rng(seed)
    drawn = rng.choice(values, size=len(types), p=counts / counts.sum())
    return dict(zip(types, drawn.tolist(), strict=True))


# ---------------------------------------------------------------------------------------------- features
