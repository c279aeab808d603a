"""Layer-streamed forward: every layer of a model larger than memory, each layer's weights read once
per block of texts.

The block's residual stream stays where the model runs (or waits in host memory: residual.py)
while the weights stream in, one unit at a time (model.py): the embeddings over every batch of the
block, then layer 1 over every batch, and so on. One loop serves every family; what differs (the
embeddings, a layer's step, what a batch carries to its layers) are the model's hooks (encoder.py,
decoder.py). The numbers are the in-memory packed forward's: the same modules run the same ops.
How the blocks run (their size, the batches, where the stream waits) is the :class:`StreamPlan`
the forward is built with (plan.py); nothing about it is set afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..forward.concurrent import ForwardPool
from .model import StreamedModel
from .plan import StreamPlan
from .residual import Residual

# what a block keeps of batch i's hidden state ``depth`` ``(N, H)``: the state itself, or less (the
# call's pools: _engine/blocks.py), computed as soon as the layer is, so the block never holds
# every layer
Keep = Callable[[int, int, torch.Tensor], torch.Tensor]
After = Callable[[int, torch.Tensor], None]  # what a layer does with batch i's output on the device


def _as_is(i: int, depth: int, hidden: torch.Tensor) -> torch.Tensor:
    return hidden


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
        self, batches: Sequence[Any], layers: Sequence[int], keep: Keep = _as_is
    ) -> list[torch.Tensor]:
        """Hidden states ``layers`` of every batch of a block: ``(len(layers), N_b, H)`` each, as
        ``keep`` keeps them (a decoder's: the raw residual stream; the engine applies the final
        norm a call asks for)."""
        model, wanted, deepest = self.model, set(layers), max(layers)
        kept: list[dict[int, torch.Tensor]] = [{} for _ in batches]
        carried: list[Any] = [None] * len(batches)
        vocabulary = torch.unique(torch.cat([b.ids for b in batches]))
        hidden: list[torch.Tensor] = []
        with model.running(), model.loaded(deepest, vocabulary) as units:
            for depth in units:

                def after(i: int, h: torch.Tensor, depth: int = depth) -> None:
                    if depth == 0:  # what the batch carries to every layer, on the device
                        carried[i] = model.carried(h, batches[i])
                    if depth in wanted:  # what the call keeps of it, as soon as it is computed
                        kept[i][depth] = keep(i, depth, h)

                last = depth == deepest
                if depth == 0:
                    embed = [(b, vocabulary) for b in batches]
                    hidden = self._each(model.embed, embed, after, last=last, moving=False)
                else:
                    items = list(zip(hidden, batches, carried, strict=True))
                    hidden.clear()  # each state let go as its batch runs (residual.py)
                    hidden = self._each(model.layer_step(depth), items, after, last=last)
                model.after_layer(depth)
        return [torch.stack([store[i] for i in layers]) for store in kept]

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
