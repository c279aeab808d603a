"""Hugging Face's own forward of a padded batch, cut at the deepest requested layer: the path
for hooks, the BERT-family taps and architectures the packed forward does not run (the engine,
_engine/engine.py, picks it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..._settings.settings import Method
from ...errors import ModelLoadError
from ..decoders import final_norm_known, raw_hidden_states, settle_final_norm
from ..families import is_decoder_config
from .hooks import HookRecorder, truncated_encoder


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


def forward_batch(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    *,
    layers: Sequence[int],
    method: Method,
    layer_owner: nn.Module,
    layer_attr: str,
    layer_list: nn.ModuleList,
    model_type: str,
    taps: Sequence[str] = (),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Run the encoder up to the deepest requested layer.

    Returns hidden states ``(n_layers, B, T, H)`` and taps ``{name: (n_tap_layers, B, ...)}``.
    Hidden state 0 is read at the input of the first layer, so at least one layer always runs.
    A decoder's states are all the raw residual stream: the engine applies the final norm a call
    asks for (:func:`apply_final_norm`). The deepest state is its layer's own output (:func:`warm_up`
    checks that layer outputs are the hidden states): a model cut short may pass the last layer it
    runs through its final norm (T5's encoder, Falcon, BLOOM do), which a full run does not."""
    depth = max(1, max(layers))
    tap_layers = [i for i in layers if i >= 1]
    deepest: dict[int, torch.Tensor] = {}
    # the raw last state is read from its layer unless transformers' own is the one given: an
    # encoder's at full depth (T5's after its final norm), a decoder whose final norm is unknown
    own_last = depth == len(layer_list) and (
        not is_decoder_config(model.config) or not final_norm_known(model)
    )
    keep = None if own_last else layer_list[depth - 1].register_forward_hook(_keeper(deepest, depth))
    with (
        truncated_encoder(layer_owner, layer_attr, layer_list, depth),
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
                output = model(**batch, **kwargs)
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
    # a placed model's states come from each layer's device: gathered where its inputs went
    placed = is_placed(model)
    hidden = (
        gathered(states, layers, batch["input_ids"].device)
        if placed
        else torch.stack([states[i] for i in layers])
    )
    tapped = {t: torch.stack([recorder.taps[t][i] for i in tap_layers]) for t in taps if tap_layers}
    return hidden, tapped


def _keeper(kept: dict[int, torch.Tensor], depth: int):
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        kept[depth] = output[0] if isinstance(output, tuple | list) else output

    return hook


def warm_up(model: Any, ids: list[int], device: torch.device, name: str, layer_list: nn.ModuleList) -> None:
    """One full-depth forward with ``output_hidden_states`` before any truncated one.

    transformers 5 installs its hidden-state capture hooks lazily, on the layers present at the
    first such call; if that call ran on a truncated encoder, later full runs would miss layers.
    It also checks what the forwards rely on, for any architecture: one hidden state per layer plus
    the embeddings, each layer's output its hidden state (a run cut at a layer reads that output),
    and for a decoder which final norm gives transformers' last state (decoders.py)."""
    expected = model.config.num_hidden_layers + 1
    outputs: dict[int, torch.Tensor] = {}
    hooks = [layer.register_forward_hook(_keeper(outputs, i)) for i, layer in enumerate(layer_list, start=1)]
    try:
        with torch.inference_mode():
            given = torch.tensor([ids], device=device)
            states = model(input_ids=given, output_hidden_states=True).hidden_states
    finally:
        for hook in hooks:
            hook.remove()
    if len(states) != expected:
        raise ModelLoadError(
            f"{name!r} returned {len(states)} hidden states, expected {expected} "
            "(embeddings + one per layer); layerwise reads models that return one per layer"
        )
    for i in range(1, expected - 1):
        output = outputs[i].to(states[i].device)  # NaN weights are a run's to report (allow_nan), not this
        if output.shape != states[i].shape or not torch.allclose(
            output, states[i], rtol=0, atol=0, equal_nan=True
        ):
            raise ModelLoadError(
                f"{name!r} ({model.config.model_type}): the output of layer {i} is not its hidden state "
                "(the model changes the states between layers), so a run cut at a layer would give "
                "other numbers than a full one; layerwise cannot read this architecture"
            )
    if is_decoder_config(model.config):
        settle_final_norm(model, outputs[expected - 1].to(states[-1].device), states[-1])


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
