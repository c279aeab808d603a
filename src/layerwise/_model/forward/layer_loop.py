"""The one layer loop of every packed forward: in memory (the BERT-layout encoders: packed.py; the
decoders and ModernBERT: packed_decoder.py) and streamed (streaming/forward.py).

A block of batches runs unit by unit: the embeddings over every batch of the block, then layer 1
over every batch, and so on up to the deepest layer asked for, and no further. What a family does
at each unit is its adapter's (decoder_blocks.py, the BERT encoders' packed.py); where the weights
are is the model's strategy: resident (in memory: a block is one batch and nothing is loaded or
released) or streamed from the checkpoint, one unit at a time (streaming/model.py). How one unit
runs over the block's batches (one after another, on concurrent forwards, with the residual stream
waiting in host memory) is the caller's ``each``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import torch

# what a block keeps of batch i's hidden state ``depth`` ``(N, H)``: the state itself, or less (the
# call's pools: _engine/blocks.py), computed as soon as the layer is, so the block never holds
# every layer
Keep = Callable[[int, int, torch.Tensor], torch.Tensor]
After = Callable[[int, torch.Tensor], None]  # what a unit does with batch i's output on the device
# how one unit's step runs over the block's items: (step, items, after, last=, moving=) -> outputs
Each = Callable[..., list[torch.Tensor]]


class LayerModel(Protocol):
    """What the loop asks of a model: its weights' strategy and its family's adapter."""

    def vocabulary(self, batches: Any) -> torch.Tensor | None: ...

    def loaded(self, last: int, vocabulary: Any) -> AbstractContextManager[Iterator[int]]: ...

    def embed(self, batch: Any, vocabulary: Any) -> torch.Tensor: ...

    def carried(self, hidden: torch.Tensor, batch: Any) -> Any: ...

    def layer_step(self, depth: int) -> Callable[[torch.Tensor, Any, Any], torch.Tensor]: ...

    def after_layer(self, depth: int) -> None: ...


class Resident:
    """The weights' strategy of a model in memory: a block is one batch, every unit is there, and
    nothing is loaded or released (a subclass gives the family's embed, carried and layer_step)."""

    def vocabulary(self, batches: Any) -> None:
        return None  # the whole word table is there

    @contextmanager
    def loaded(self, last: int, vocabulary: Any) -> Iterator[Iterator[int]]:
        yield iter(range(last + 1))

    def carried(self, hidden: torch.Tensor, batch: Any) -> Any:
        return None

    def after_layer(self, depth: int) -> None:
        return None


def as_is(i: int, depth: int, hidden: torch.Tensor) -> torch.Tensor:
    return hidden


def one_after_another(
    step: Callable[..., torch.Tensor], items: list[tuple], after: After, *, last: bool, moving: bool = True
) -> list[torch.Tensor]:
    """Each item's step in turn, on the device where the model runs."""
    outputs = []
    for i in range(len(items)):
        item, items[i] = items[i], ()  # each input let go once its batch has run
        output = step(*item)
        del item
        after(i, output)
        if not last:
            outputs.append(output)
    return outputs


def run_block(
    model: LayerModel,
    batches: Sequence[Any],
    layers: Sequence[int],
    keep: Keep = as_is,
    each: Each = one_after_another,
) -> list[torch.Tensor]:
    """Hidden states ``layers`` of every batch of a block: ``(len(layers), N_b, H)`` each, as ``keep``
    keeps them (raw residual streams; the engine applies the final norm a call asks for)."""
    wanted, deepest = set(layers), max(layers)
    kept: list[dict[int, torch.Tensor]] = [{} for _ in batches]
    carried: list[Any] = [None] * len(batches)
    vocabulary = model.vocabulary(batches)
    hidden: list[torch.Tensor] = []
    with model.loaded(deepest, vocabulary) as units:
        for depth in units:

            def after(i: int, h: torch.Tensor, depth: int = depth) -> None:
                if depth == 0:  # what the batch carries to every layer, on the device
                    carried[i] = model.carried(h, batches[i])
                if depth in wanted:  # what the call keeps of it, as soon as it is computed
                    kept[i][depth] = keep(i, depth, h)

            last = depth == deepest
            if depth == 0:
                embed = [(b, vocabulary) for b in batches]
                hidden = each(model.embed, embed, after, last=last, moving=False)
            else:
                items = list(zip(hidden, batches, carried, strict=True))
                hidden.clear()  # each state let go as its batch runs (streaming/residual.py)
                hidden = each(model.layer_step(depth), items, after, last=last)
            model.after_layer(depth)
    return [torch.stack([store[i] for i in layers]) for store in kept]
