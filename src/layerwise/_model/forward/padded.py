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
from ..decoders import raw_hidden_states
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
    asks for (:func:`apply_final_norm`)."""
    depth = max(1, max(layers))
    tap_layers = [i for i in layers if i >= 1]
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
        with raw_hidden_states(model):
            output = model(**batch, **kwargs)
    if method == "hidden_states":
        states = output.hidden_states
        if len(states) != depth + 1:
            raise RuntimeError(f"model returned {len(states)} hidden states after {depth} layers")
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


def warm_up(model: Any, ids: list[int], device: torch.device, name: str) -> None:
    """One full-depth forward with ``output_hidden_states`` before any truncated one.

    transformers 5 installs its hidden-state capture hooks lazily, on the layers present at the
    first such call; if that call ran on a truncated encoder, later full runs would miss layers.
    This also checks that the model returns one hidden state per layer plus the embeddings."""
    expected = model.config.num_hidden_layers + 1
    with torch.inference_mode():
        states = model(input_ids=torch.tensor([ids], device=device), output_hidden_states=True).hidden_states
    if len(states) != expected:
        raise ModelLoadError(
            f"{name!r} returned {len(states)} hidden states, expected {expected} "
            "(embeddings + one per layer); is it a BERT-family encoder?"
        )


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
