"""The general path: transformers' own forward of padded batches (padded.py), run on replicas of the
user's model (replica.py: new module objects around the same weights).

A padded forward changes its model while it runs: the layer list is cut at the deepest layer asked
for, hooks read the hidden states and taps, the tie of the last hidden state to the final norm is off
(final_norm.py), and attention probabilities need eager attention. Each of these happens to a
replica, so the model a user passed in keeps its layer list, hooks, config and attention
implementation, and a user's own forward of it on another thread sees nothing of ours. One replica
runs the plain forward; a second, built from it on first use, runs eager attention for the taps
that ask for probabilities. Padded forwards run one at a time (the engine's exclusive lock), so one
replica of each kind is enough.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from .padded import LayerReading, settle_reading
from .replica import add_hooks, model_state, replicate


class GeneralForward:
    """``model`` as the general path runs it: the replicas, and how their states are read
    (:class:`~.padded.LayerReading`, settled by a full-depth warm-up of the plain replica)."""

    def __init__(self, model: Any, ids: list[int], pad_id: int, device: torch.device, name: str) -> None:
        self.model = model
        self._warm_up = (ids, pad_id, device, name)
        self._build()

    def _build(self) -> None:
        self._state = model_state(self.model)
        self.plain: nn.Module = replicate(self.model, hooks=False)
        # transformers installs its hidden-state hooks at the first output_hidden_states call, on the
        # layers present then: the warm-up runs at full depth before any cut one (padded.warm_up),
        # without the hooks a user put on the model (they see none of layerwise's warm-up forwards)
        self.reading: LayerReading = settle_reading(self.plain, *self._warm_up)
        add_hooks(self.model, self.plain)
        self._eager: nn.Module | None = None

    def follow(self, state: list[int], alone: Callable[[], AbstractContextManager]) -> None:
        """New replicas, warmed up again, where the model's ``state`` (replica.model_state) differs
        from the one they were built from (a hook added to it, a module or weight replaced). Only
        then is the model taken ``alone`` (no padded forward runs on the old replica meanwhile)."""
        if state == self._state:
            return
        with alone():
            if state != self._state:  # a run beside this one may have rebuilt them meanwhile
                self._build()

    def replica(self, taps: Sequence[str]) -> nn.Module:
        """The replica that runs a call with ``taps``: the eager one where they ask for attention
        probabilities (SDPA never forms them), else the plain one."""
        current = getattr(self.plain.config, "_attn_implementation", None)
        if "attention_probs" not in taps or current in (None, "eager"):
            return self.plain
        if self._eager is None:
            eager = replicate(self.plain)  # warmed up: transformers' hidden-state hooks come along
            eager.set_attn_implementation("eager")  # type: ignore[operator]
            self._eager = eager
        return self._eager
