"""Hugging Face's own forward of a padded batch, cut at the deepest requested layer: the path
for hooks, the BERT-family taps and architectures the packed forward does not run (the engine,
_engine/engine.py, picks it)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..._settings.settings import Method
from ...errors import ModelLoadError
from ..final_norm import final_norm_known, raw_hidden_states, settle_final_norm, settle_from_tie
from .hooks import HookRecorder, find_layer_list, module_output, truncated_encoder


def collate(
    items: Sequence[Any], *, pad_id: int, with_token_types: bool, device: torch.device
) -> dict[str, torch.Tensor]:
    """Pad a batch (items with ``.ids``, ``.type_ids`` and a length: EncodedInput, Window) to its
    own longest item (never beyond)."""
    width = max(len(item) for item in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    types = torch.zeros((len(items), width), dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item)
        ids[row, :n] = torch.tensor(item.ids, dtype=torch.long)
        mask[row, :n] = 1
        types[row, :n] = torch.tensor(item.type_ids, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": mask}
    if with_token_types:
        batch["token_type_ids"] = types
    if device.type == "cuda":  # page-locked host memory lets the copy overlap with compute
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return batch


@dataclass(frozen=True)
class LayerReading:
    """How the padded forward reads a model's hidden states, settled at load by :func:`warm_up`.

    ``per_layer``: each layer of the layer list (``attr`` of the module at path ``owner``: the same
    in the model and in each replica of it) outputs its hidden state, so a run stops after the
    deepest layer asked for and hooks read the states. Else every state is read from
    transformers' ``output_hidden_states`` of a full run, by either method: a model whose one layer
    runs at every depth (ALBERT), whose layer list is not its layers (XLM's parallel lists) or whose
    states are changed between layers (Longformer pads them to its window, CPM-Ant).
    ``exact_padding``: a text's states in a padded batch are its states alone; else a batch holds
    texts of one length (ConvBERT's convolutions, Nyströmformer's landmarks and YOSO's hashes read the
    padding). ``shifted``: transformers' own states leave out the embeddings and give each layer's
    output one place early (Mamba, Falcon-Mamba: state 0 is layer 1's output); read by hooks, by
    either method, so that state 0 is the embeddings as for every other model."""

    owner: str | None
    attr: str
    per_layer: bool
    exact_padding: bool = True
    shifted: bool = False

    def layer_list(self, model: nn.Module) -> nn.ModuleList | None:
        """``model``'s layer list (the model's, or a replica's), or None where none was found."""
        if self.owner is None:
            return None
        return getattr(model.get_submodule(self.owner), self.attr)


def forward_batch(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    *,
    layers: Sequence[int],
    method: Method,
    reading: LayerReading,
    model_type: str,
    taps: Sequence[str] = (),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Run the encoder up to the deepest requested layer.

    Returns hidden states ``(n_layers, B, T, H)`` and taps ``{name: (n_tap_layers, B, ...)}``.
    Hidden state 0 is read at the input of the first layer, so at least one layer always runs.
    The states are all the raw residual stream, whichever ``method`` reads them: the engine applies
    the final norm a call asks for (final_norm.py). The deepest state is its layer's own output
    (:func:`warm_up` checks that layer outputs are the hidden states): a model cut short may pass the
    last layer it runs through its final norm (T5's encoder, Falcon, BLOOM do), which a full run does
    not. Where the final norm cannot be separated, the last state is transformers' own, by either
    method."""
    if not reading.per_layer:
        return _whole_run(model, batch, layers), {}
    layer_list = reading.layer_list(model)
    assert reading.owner is not None and layer_list is not None
    depth = max(1, max(layers))
    tap_layers = [i for i in layers if i >= 1]
    deepest: dict[int, torch.Tensor] = {}
    # the raw last state is read from its layer unless transformers' own is the one given: a model
    # whose final norm is not known (final_norm.py), at full depth
    own_last = depth == len(layer_list) and not final_norm_known(model)
    if reading.shifted:  # transformers' tuple is one place early: the hooks read every state
        method = "hooks"
    keep = None if own_last else layer_list[depth - 1].register_forward_hook(_keeper(deepest, depth))
    with (
        truncated_encoder(model.get_submodule(reading.owner), reading.attr, depth),
        HookRecorder(
            list(layer_list)[:depth],
            hidden=method == "hooks",
            tap_layers=tap_layers,
            taps=taps,
            model_type=model_type,
        ) as recorder,
    ):
        kwargs: dict[str, object] = {"output_hidden_states": method == "hidden_states"}
        if "attention_probs" in taps:
            kwargs["output_attentions"] = True
        try:
            with raw_hidden_states(model):
                output = model(**batch, **kwargs, **no_cache(model))
        finally:
            if keep is not None:
                keep.remove()
    states: list[torch.Tensor] | dict[int, torch.Tensor]
    if method == "hidden_states":
        states = list(output.hidden_states)
        if len(states) != depth + 1:
            raise RuntimeError(f"model returned {len(states)} hidden states after {depth} layers")
        if depth in deepest:
            states[depth] = deepest[depth]
    else:
        states = dict(recorder.hidden)
        if own_last:  # the hooks see the raw output; transformers' own last state is the one given
            states[depth] = output[0]
    tapped = {t: torch.stack([recorder.taps[t][i] for i in tap_layers]) for t in taps if tap_layers}
    return _stacked(model, states, layers, batch), tapped


def _whole_run(model: nn.Module, batch: Mapping[str, torch.Tensor], layers: Sequence[int]) -> torch.Tensor:
    """Every state from transformers' ``output_hidden_states`` of a full run (see LayerReading)."""
    with raw_hidden_states(model):
        states = list(model(**batch, output_hidden_states=True, **no_cache(model)).hidden_states)
    return _stacked(model, states, layers, batch)


def _stacked(model: nn.Module, states: Any, layers: Sequence[int], batch: Mapping[str, torch.Tensor]):
    # a placed model's states come from each layer's device: gathered where its inputs went
    if is_placed(model):
        return gathered(states, layers, batch["input_ids"].device)
    return torch.stack([states[i] for i in layers])


def no_cache(model: Any) -> dict[str, bool]:
    """``use_cache=False`` where the forward takes it: extraction reads every state once, and a
    hybrid's cache of linear-attention layers (Qwen3-Next, Jamba) fails to build without attention."""
    model_class: Any = type(model)
    return {"use_cache": False} if _takes_use_cache(model_class) else {}


@functools.cache
def _takes_use_cache(model_class: Any) -> bool:
    return "use_cache" in inspect.signature(model_class.forward).parameters


def _keeper(kept: dict[int, torch.Tensor], depth: int):
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        kept[depth] = module_output(output)

    return hook


def settle_reading(model: Any, ids: list[int], pad_id: int, device: torch.device, name: str) -> LayerReading:
    """How ``model``'s states are read (:class:`LayerReading`): its layer list found by shape, then
    checked by :func:`warm_up`."""
    found = find_layer_list(model, model.config.num_hidden_layers)
    candidate = LayerReading(None, "", False) if found is None else LayerReading(*found, True)
    return warm_up(model, ids, pad_id, device, name, candidate)


def warm_up(
    model: Any, ids: list[int], pad_id: int, device: torch.device, name: str, found: LayerReading
) -> LayerReading:
    """One full-depth forward with ``output_hidden_states`` before any truncated one; how the model's
    states are read from then on (:class:`LayerReading`).

    transformers 5 installs its hidden-state capture hooks lazily, on the layers present at the
    first such call; if that call ran on a truncated encoder, later full runs would miss layers.
    It also checks what the forwards rely on, for any architecture: one hidden state per layer plus
    the embeddings, whether each layer's output is its hidden state (a run cut at a layer reads that
    output), whether padding leaves a text's states alone, and which final norm gives transformers'
    last state (final_norm.py)."""
    expected = model.config.num_hidden_layers + 1
    outputs: dict[int, torch.Tensor] = {}
    found_list = found.layer_list(model)
    layer_list: Sequence[nn.Module] = [] if found_list is None else list(found_list)
    hooks = [layer.register_forward_hook(_keeper(outputs, i)) for i, layer in enumerate(layer_list, start=1)]
    given = torch.tensor([ids], device=device)
    try:
        with torch.inference_mode():
            states = model(input_ids=given, output_hidden_states=True, **no_cache(model)).hidden_states
    finally:
        for hook in hooks:
            hook.remove()
    if len(states) != expected:
        raise ModelLoadError(
            f"{name!r} returned {len(states)} hidden states, expected {expected} "
            "(embeddings + one per layer); layerwise reads models that return one per layer"
        )
    shapes = [
        tuple(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__ for state in states
    ]
    # OPT-350m projects its last state to the word embeddings' width (project_out), for the head
    # alone: its residual stream is read at every layer, the last one's too, and said so (docs)
    projected = _projects_out(model) and len(set(shapes[:-1])) == 1
    if len(set(shapes)) > 1 and not projected:
        raise ModelLoadError(
            f"{name!r} ({model.config.model_type}): its hidden states change shape between layers "
            f"({' '.join(map(str, shapes))}: Funnel pools the sequence, some models keep several residual "
            "streams); layerwise reads one state per token at every layer"
        )

    def given_as(i: int, k: int) -> bool:  # layer i's output is transformers' state k
        return i in outputs and _same(outputs[i].to(states[k].device), states[k])

    per_layer = found_list is not None and all(given_as(i, i) for i in range(1, expected - 1))
    shifted = not per_layer and found_list is not None and all(given_as(i, i - 1) for i in range(1, expected))
    per_layer = per_layer or shifted
    if projected:
        settle_final_norm(model, outputs[expected - 1], outputs[expected - 1])  # none to separate
    elif per_layer:
        settle_final_norm(model, outputs[expected - 1].to(states[-1].device), states[-1])
    else:
        with torch.inference_mode():
            settle_from_tie(model, given, states[-1], no_cache(model))
    exact = _exact_padding(model, ids, pad_id, device)
    return LayerReading(found.owner, found.attr, per_layer, exact, shifted)


def _projects_out(model: Any) -> bool:
    return getattr(getattr(model, "decoder", model), "project_out", None) is not None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    # NaN weights are a run's to report (allow_nan), not this check's
    return a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)


def _exact_padding(model: Any, ids: list[int], pad_id: int, device: torch.device) -> bool:
    """Whether each text's states in a right-padded batch are its states alone (to 1e-5): texts of
    2, 7 and 19 tokens (``ids`` and ids of the vocabulary's first rows) in one batch."""
    vocab = int(getattr(model.config, "vocab_size", 0) or 0) or 16
    words = [k % vocab for k in range(5, 22)]
    texts = [ids, [ids[0], *words[:5], ids[-1]], [ids[0], *words, ids[-1]]]
    width = max(len(t) for t in texts)
    grid = torch.full((len(texts), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(grid)
    for row, text in enumerate(texts):
        grid[row, : len(text)] = torch.tensor(text, device=device)
        mask[row, : len(text)] = 1
    with torch.inference_mode(), raw_hidden_states(model):
        padded = model(input_ids=grid, attention_mask=mask, output_hidden_states=True, **no_cache(model))
        padded = padded.hidden_states
        for row, text in enumerate(texts):
            one = grid[row : row + 1, : len(text)]
            alone = model(input_ids=one, output_hidden_states=True, **no_cache(model)).hidden_states
            for p, a in zip(padded, alone, strict=True):
                if not torch.allclose(
                    p[row, : len(text)].float(), a[0].float(), rtol=1e-5, atol=1e-5, equal_nan=True
                ):
                    return False
    return True


def is_placed(model: Any) -> bool:
    """Whether accelerate placed ``model`` (a device map or quantised weights)."""
    return bool(getattr(model, "hf_device_map", None)) or getattr(model, "is_quantized", False)


def gathered(states: Any, layers: Sequence[int], device: torch.device) -> torch.Tensor:
    """A placed model's hidden states ``states[i]`` for ``i`` in ``layers`` on ``device``, copied
    synchronously (each came from its layer's device); a layer whose states are all zeros is a
    failed copy, never a real residual stream, and raises."""
    hidden = torch.stack([states[i].to(device) for i in layers])
    dead = (hidden.reshape(len(layers), -1) == 0).all(dim=1).tolist()
    if any(dead):
        where = {i: str(states[i].device) for i, d in zip(layers, dead, strict=True) if d}
        devices = sorted(set(where.values()))
        raise ModelLoadError(
            f"the hidden states of layers {sorted(where)} came back all zeros from {devices}: "
            "a copy between devices failed (peer-to-peer transfers between these GPUs?). Try "
            "NCCL_P2P_DISABLE=1, a device map that keeps the model on fewer GPUs, or streaming=True"
        )
    return hidden
