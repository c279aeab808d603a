"""Layer-streamed forward: every layer of a model larger than memory, each layer's weights read once
per block of texts.

The block's residual stream stays where the model runs (or waits in host memory: residual.py)
while the weights stream in, one unit at a time (model.py): the embeddings over every batch of the
block, then layer 1 over every batch, and so on. The loop is the in-memory decoders' too
(forward/layer_loop.py); what differs between families (the embeddings, a layer's step, what a
batch carries to its layers) are the model's hooks (encoder.py, decoder.py). The numbers are the
in-memory packed forward's: the same modules run the same ops. How the blocks run (their size, the
batches, where the stream waits) is the :class:`StreamPlan` the forward is built with (plan.py);
nothing about it is set afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..forward.concurrent import ForwardPool
from ..forward.layer_loop import After, Keep, as_is, run_block
from .model import StreamedModel
from .plan import StreamPlan
from .residual import Residual


@dataclass(frozen=True)
class StreamedForward:
    """The streamed forward of ``model``, run as ``plan`` says; ``pool``: the engine's concurrent
    forwards on a CPU (batches of one layer are independent, as the in-memory forward runs them).
    Frozen: what it runs with is fixed when it is built."""

    model: StreamedModel
    plan: StreamPlan
    pool: ForwardPool | None = None
    residual: Residual = field(init=False)

    def __post_init__(self) -> None:
        on_host = self.plan.residual == "host"
        object.__setattr__(self, "residual", Residual(self.model.device, on_host=on_host))

    def prepare(self, columns: Any, *, with_token_types: bool, device: torch.device) -> Any:
        return self.model.prepare(columns, with_token_types=with_token_types, device=device)

    def forward_block(
        self, batches: Sequence[Any], layers: Sequence[int], keep: Keep = as_is
    ) -> list[torch.Tensor]:
        """Hidden states ``layers`` of every batch of a block: ``(len(layers), N_b, H)`` each, as
        ``keep`` keeps them (a decoder's: the raw residual stream; the engine applies the final
        norm a call asks for)."""
        return run_block(self.model, batches, layers, keep, self._each)

    def _each(
        self,
        step: Callable[..., torch.Tensor],
        items: list[tuple],
        after: After,
        *,
        last: bool,
        moving: bool = True,
    ) -> list[torch.Tensor]:
        """``step(*item)`` for each batch's item, ``after(i, output)`` on each output: through the
        residual stream's place (residual.py), or on the concurrent forwards when there are some."""
        if self.pool is None or len(items) < 2 or self.residual.on_host:
            return self.residual.run(step, items, after, last=last, moving=moving)

        def run(item: tuple) -> torch.Tensor:
            with torch.inference_mode():  # thread-local: each forward's thread enters it
                return step(*item)

        futures = [self.pool.submit(run, item) for item in items]
        items.clear()  # each input let go once its batch has run, as Residual.run does
        outputs = [future.result() for future in futures]
        for i, output in enumerate(outputs):
            after(i, output)
        return outputs
