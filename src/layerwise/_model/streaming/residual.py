"""Where a streamed block's residual stream waits between layers: on the device, or in host memory.

A block's residual stream is its tokens x hidden x the dtype's bytes: 2.1 GB for 262,144 tokens of
a 4,096-wide model in bfloat16. When the device budget cannot hold it beside two layers' weights,
the block still runs at its full size with the stream in pinned host memory: each batch is copied
to the device before its layer and back after it. On a GPU the copies run on a stream of their own
(batch k+1 comes in and batch k-1 goes out while batch k computes), so PCIe time overlaps the
layer's compute; the copy and compute streams wait on each other only where one reads what the
other wrote. plan.py chooses the place (and sizes the batch then), forward.py runs each layer's
batches through :meth:`Residual.run`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..forward.layer_loop import one_after_another


class Residual:
    """A block's residual stream between layers: on ``device`` (``on_host=False``: nothing moves), or
    in host memory, pinned on a GPU."""

    def __init__(self, device: torch.device, *, on_host: bool) -> None:
        self.device, self.on_host = device, on_host
        self._cuda = on_host and device.type == "cuda"
        self._copies: Any = torch.cuda.Stream(device) if self._cuda else None

    @property
    def place(self) -> str:
        """``"host"`` or ``"device"``, as ``read_meta``'s ``stream_residual`` reports it."""
        return "host" if self.on_host else "device"

    def run(
        self,
        step: Callable[..., torch.Tensor],
        items: list[tuple],
        after: Callable[[int, torch.Tensor], None],
        *,
        last: bool,
        moving: bool = True,
    ) -> list[torch.Tensor]:
        """``step(hidden, *rest)`` for each batch's ``(hidden, *rest)`` in turn (``moving=False``: the
        first item is not a hidden state, as for the embeddings), ``after(i, output)`` on each output
        while it is on the device; the outputs where the stream waits (none after the ``last`` layer:
        nothing reads them). ``items`` is consumed: each batch's input is let go once its layer has
        run, so a block holds one layer's states and the running batch's, not two layers'."""
        if not self.on_host:  # nothing moves: the layer loop's own way (forward/layer_loop.py)
            return one_after_another(step, items, after, last=last)
        outputs: list[torch.Tensor] = []
        copying = moving  # inputs in host memory, each copied in before its layer
        coming = self._to_device(items[0][0]) if copying and items else None
        for i in range(len(items)):
            item, items[i] = items[i], ()
            if copying:
                hidden = coming
                if i + 1 < len(items):  # the next batch comes in while this one computes
                    coming = self._to_device(items[i + 1][0])
                output = step(self._ready(hidden), *item[1:])
                del hidden
            else:
                output = step(*item)
            del item
            after(i, output)
            if not last:
                outputs.append(self._to_host(output))
        return outputs

    def _to_device(self, host: torch.Tensor) -> Any:
        """``host`` copied to the device: on the copy stream, with the event the compute stream waits
        for before reading it."""
        if not self._cuda:
            return host.to(self.device)
        with torch.cuda.stream(self._copies):
            moved = host.to(self.device, non_blocking=True)  # ordered after its own copy out
            done = torch.cuda.Event()
            done.record(self._copies)
        return moved, done

    def _ready(self, coming: Any) -> torch.Tensor:
        """The batch's hidden state on the device, once its copy is done (the compute stream waits)."""
        if not self._cuda:
            return coming
        moved, done = coming
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(done)
        moved.record_stream(compute)  # its memory is not reused before the compute stream is done
        return moved

    def _to_host(self, output: torch.Tensor) -> torch.Tensor:
        """``output`` copied to host memory (pinned on a GPU, on the copy stream, once the compute
        stream has written it)."""
        host = torch.empty(output.shape, dtype=output.dtype, device="cpu", pin_memory=self._cuda)
        if not self._cuda:
            return host.copy_(output)
        self._copies.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._copies):
            host.copy_(output, non_blocking=True)  # pinned: the allocator keeps it until the copy ends
        output.record_stream(self._copies)  # not reused by the compute stream before the copy is done
        return host
