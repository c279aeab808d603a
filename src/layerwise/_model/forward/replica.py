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

from ..notes import note_replica
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


_CAPTURE_INSTALLED = "_output_capturing_hooks_installed"  # transformers' flag: its capture hooks are on
# a module's forward hooks, and what says how each is called
_HOOKS = ("_forward_hooks", "_forward_pre_hooks")
_HOOK_DICTS = (
    *_HOOKS,
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks_with_kwargs",
)


def replicate(model: nn.Module, config: Any = None, *, hooks: bool = True) -> nn.Module:
    """``model``'s module tree copied around its own tensors, with a config of its own: ``config``, or
    a copy of the model's. The model's forward hooks come along (``hooks``; else :func:`add_hooks`
    adds them later), each the same callable: a hook that is a method of a user's recorder records
    into that recorder, not a copy of it. accelerate's placement hooks (a device map, offloaded
    weights) are shared too: they hold the offloaded weights, and move them onto whichever module
    they run for. What layerwise noted about ``model`` (notes.py) holds for the replica."""
    shared: dict[int, Any] = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    for module in model.modules():
        for name in _HOOK_DICTS:
            found = getattr(module, name)
            shared[id(found)] = copy.copy(found) if hooks else type(found)()
        hook = getattr(module, "_hf_hook", None)
        if hook is not None:
            shared[id(hook)] = hook
    if config is not None:
        shared[id(model.config)] = config
    replica = copy.deepcopy(model, shared)
    if not hooks:  # transformers' hidden-state capture too: its first call installs it afresh
        for module in replica.modules():
            module.__dict__.pop(_CAPTURE_INSTALLED, None)
    note_replica(replica, model)
    return replica


def add_hooks(model: nn.Module, replica: nn.Module) -> None:
    """The user's forward hooks on ``model``'s modules (not transformers' capture: the replica has
    its own) added to ``replica``'s (one built without hooks), ahead of the ones it has: a hook that
    changes a layer's output changes the hidden state read, as it changes what the next layer
    receives. Modules are matched by name: a model may have replaced some of its own while it ran
    (BigBird swaps its attention for full attention on short texts)."""
    copies = dict(replica.named_modules())
    for name, module in model.named_modules():
        copied = copies.get(name)
        if copied is None:
            continue
        users = {key for hooks in _HOOKS for key, hook in getattr(module, hooks).items() if _users(hook)}
        for hooks in _HOOK_DICTS:
            ours, theirs = getattr(copied, hooks), getattr(module, hooks)
            merged = {**{key: value for key, value in theirs.items() if key in users}, **ours}
            ours.clear()
            ours.update(merged)


def _users(hook: Any) -> bool:
    """Whether a hook is a user's, not transformers' own (the capture of hidden states)."""
    return not getattr(hook, "__module__", "").startswith("transformers.")


def users_hooks(model: nn.Module) -> bool:
    """Whether a module of ``model`` carries a forward hook that is not transformers' own (the
    hidden-state capture it installs on a model's first ``output_hidden_states`` call)."""
    for module in model.modules():
        if any(
            map(_users, itertools.chain(module._forward_hooks.values(), module._forward_pre_hooks.values()))
        ):
            return True
    return False


def model_state(model: nn.Module) -> list[int]:
    """What a replica of ``model`` copies of it beside its tensors' values: its modules, the tensors
    they hold and their hooks. A replica built when the state was different is stale (a module or
    a weight replaced, a hook added or removed since): the forwards build a new one."""
    state: list[int] = []
    for module in model.modules():
        state.append(id(module))
        state.extend(map(id, module._parameters.values()))
        state.extend(map(id, module._buffers.values()))
        state.extend(module._forward_hooks)
        state.extend(module._forward_pre_hooks)
    return state


def packed_replica(model: nn.Module) -> nn.Module:
    """A replica of ``model`` whose attention modules call the packed attention."""
    return replicate(model, packed_config(model.config))


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
    """Replicas of ``model`` built by ``build`` and handed out one per forward: a forward takes a free
    one, or builds one when every replica is in use (at most one per concurrent forward). After
    :meth:`follow` finds the model changed, the replicas built before are dropped as they come back."""

    def __init__(self, model: nn.Module, build: Callable[[], Any]) -> None:
        self._model, self._build, self._free, self._lock = model, build, [], threading.Lock()
        self._state, self._generation = model_state(model), 0
        self._free.append((0, build()))  # the first at once: a model the packed forward cannot copy fails now

    def follow(self, state: list[int]) -> None:
        """Drop the replicas of an earlier ``state`` of the model (model_state, a run's first step)."""
        with self._lock:
            if state != self._state:
                self._state, self._generation, self._free = state, self._generation + 1, []

    @contextmanager
    def take(self) -> Iterator[Any]:
        with self._lock:
            generation, replica = self._free.pop() if self._free else (self._generation, None)
        if replica is None:
            replica = self._build()
        try:
            yield replica
        finally:
            with self._lock:
                if generation == self._generation:
                    self._free.append((generation, replica))
