"""One warm-up of a GPU when an Encoder is made, so that its first call runs at the speed of later ones.

A fresh process pays for a GPU's set-up on the first batches it runs: CUDA loads each kernel when it
is first launched, cuBLAS picks its algorithms per shape, torch's caching allocator grows to the
batch's working set by ``cudaMalloc``, and the first page-locked (pinned) host buffers are allocated
(0.34 s for the first 100 MB on an H100 host). On an H100 the first ``extract`` of a fresh Encoder
took 8.3 s and the second 0.78 s. :func:`warm_device` runs the packed forward once on a full batch of
the Encoder's largest inputs, every hidden state, with the results copied to the host as a call
copies them: what is set up then stays (allocations go back to torch's caches, not to the driver).
On the CPU there is nothing to set up, and nothing runs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .._inputs.batches import TokenUnit

if TYPE_CHECKING:
    from .._engine.engine import Engine

# tokens per warm-up input: a decoder's max_length (32,768 for Gemma 3) would make one input's
# attention alone several GB, more than the batches of most corpora ever need
UNIT_TOKENS = 512


def warm_up_units(engine: Engine, token_id: int, max_tokens: int | None = None) -> list[TokenUnit]:
    """The inputs of one full batch: inputs of ``min(engine.max_length, UNIT_TOKENS)`` tokens of
    ``token_id``, as many as the token budget (``max_tokens``, else the engine's) and batch size
    allow (at least one)."""
    length = min(engine.max_length, UNIT_TOKENS)
    n_inputs = max(1, min(engine.batch_size, (max_tokens or engine.max_tokens) // length))
    unit = TokenUnit((token_id,) * length, (0,) * length)
    return [unit] * n_inputs


def warm_device(
    engine: Engine, token_id: int, n_hidden_states: int, *, max_tokens: int | None = None
) -> float:
    """Run the forward once on :func:`warm_up_units` (every hidden state, copied to the host as a
    call copies them) and return its seconds. On a CUDA device the Encoder does this when it is made."""
    started = time.perf_counter()
    units = warm_up_units(engine, token_id, max_tokens)
    for _ in engine.forward_units(units, layers=tuple(range(n_hidden_states)), final_norm=False):
        pass  # each batch's rows are read (the host copy waited for) and dropped
    return time.perf_counter() - started
