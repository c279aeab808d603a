"""Does torch.compile pay for the packed forward on CPU? An experiment, not a feature.

    python benchmarks/compile_trial.py

Times ``Encoder().extract`` (packed) on the extract_speed corpus eagerly (best of 2), then wraps
the packed layer in ``torch.compile(dynamic=True)`` (inductor), times the warm-up on 64 texts
(compilation and recompilation) and the compiled runs (best of 2). The verdict for a user is
whether warm-up + corpus time beats eager for a 10k-text run (~300k tokens).
"""

from __future__ import annotations

import logging
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from corpus import mixed_corpus

import layerwise as lw

logging.getLogger("layerwise").setLevel(logging.ERROR)
texts = mixed_corpus(1000, 40)
enc = lw.Encoder(max_length=512)
n = sum(len(e) for e in enc.tokenize(texts))
enc.extract(texts[:16])
base = []
for _ in range(2):
    t = time.perf_counter()
    enc.extract(texts, progress=False)
    base.append(time.perf_counter() - t)
pk = enc.engine.packed
orig = pk._layer
pk._layer = torch.compile(orig, dynamic=True)
t = time.perf_counter()
enc.extract(texts[:64], progress=False)
first = time.perf_counter() - t
comp = []
for _ in range(2):
    t = time.perf_counter()
    enc.extract(texts, progress=False)
    comp.append(time.perf_counter() - t)
eager, compiled = n / min(base), n / min(comp)
print(
    f"eager {eager:.0f} tok/s; compile warm-up on 64 texts {first:.1f} s; compiled {compiled:.0f} tok/s ({compiled / eager - 1:+.0%})"
)
tokens = 300_000
print(
    f"10k texts (~{tokens:,} tokens): eager {tokens / eager:.0f} s, compiled {first + tokens / compiled:.0f} s incl. warm-up"
)
