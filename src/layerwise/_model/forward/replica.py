"""A replica of the user's model for the packed forward: new module objects around the same
weights, so the packed forward changes nothing on the model a user passed in.

The packed forward needs the model's modules to behave differently: attention through the packed
attention (a config of ours: packed_attention.py), the linear layers of its blocks on oneDNN with
prepacked weights where that wins (cpu_gemm.py), and the sub-layer taps recorded. A replica is a
deep copy of the module tree in which every parameter and buffer is the model's own tensor (no
weight is copied: an edit in place reaches both) and the config is ours; its blocks' ``nn.Linear``
modules are :class:`PrepackedLinear` and its tap modules carry hooks that record into the replica's
``sink``. One replica serves one forward at a time (:class:`Replicas` hands them out), so forwards
of different batches on concurrent threads each record their own taps.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from .cpu_gemm import PrepackedLinears
from .hooks import module_output
from .packed_attention import packed_config

Sink = dict[str, dict[int, torch.Tensor]]  # a forward's taps: {tap: {depth: (N, H)}}


class PrepackedLinear(nn.Module):
    """An ``nn.Linear``'s forward on ``linears`` (oneDNN with its weight prepacked, where that
    applies; ``F.linear`` else), holding the same weight and bias tensors."""

    def __init__(self, linear: nn.Linear, linears: PrepackedLinears) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.linears = linears

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = self.linears(x.reshape(-1, x.shape[-1]), self.weight, self.bias)
        return flat.view(*x.shape[:-1], flat.shape[-1])


def replicate(model: nn.Module) -> nn.Module:
    """``model``'s module tree copied around its own tensors, with a config of its own that calls the
    packed attention."""
    shared: dict[int, Any] = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    shared[id(model.config)] = packed_config(model.config)
    return copy.deepcopy(model, shared)


def prepack_linears(layers: list[nn.Module], linears: PrepackedLinears) -> None:
    """Each ``nn.Linear`` inside ``layers`` (a replica's) as a :class:`PrepackedLinear`."""
    for layer in layers:
        owners = [(owner, name, child) for owner in layer.modules() for name, child in owner.named_children()]
        for owner, name, child in owners:
            if type(child) is nn.Linear:
                setattr(owner, name, PrepackedLinear(child, linears))


class Replica:
    """One replica of a model: ``model`` (the copied base model) and the ``sink`` its tap hooks
    record into during one forward: ``{tap: {depth: (N, H)}}`` for the depths in ``depths``."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.sink: Sink | None = None
        self.depths: frozenset[int] = frozenset()

    def record_into(self, module: nn.Module, tap: str, depth: int) -> None:
        """Record ``module``'s output as tap ``tap`` of block ``depth`` while a forward asks for it."""

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            sink = self.sink
            if sink is None or tap not in sink or depth not in self.depths:
                return
            sink[tap][depth] = module_output(output)[0]

        module.register_forward_hook(hook)

    @contextmanager
    def recording(self, taps: tuple[str, ...], depths: set[int]) -> Iterator[Sink]:
        self.sink, self.depths = {tap: {} for tap in taps}, frozenset(depths)
        try:
            yield self.sink
        finally:
            self.sink, self.depths = None, frozenset()


class Replicas:
    """Replicas built by ``build`` and handed out one per forward: a forward takes a free one, or
    builds one when every replica is in use (at most one per concurrent forward)."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build, self._free, self._lock = build, [], threading.Lock()
        self._free.append(build())  # the first at once: a model the packed forward cannot copy fails now

    @contextmanager
    def take(self) -> Iterator[Any]:
        with self._lock:
            replica = self._free.pop() if self._free else None
        if replica is None:
            replica = self._build()
        try:
            yield replica
        finally:
            with self._lock:
                self._free.append(replica)
