"""The forward pass: one padded batch in, every requested hidden state out.

Two ways to collect hidden states, which agree exactly (a test checks it):

* ``"hidden_states"``: the model's own ``output_hidden_states=True``;
* ``"hooks"``: forward hooks on each encoder layer, the way many tutorials do it.

Either way the encoder is cut after the deepest requested layer (:func:`truncated_encoder`), and
sub-layer taps are recorded with hooks. Results come back as :class:`LayerStack`, one per input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch
from torch import nn

from .hooks import HookRecorder, truncated_encoder
from .inputs import EncodedInput
from .results import LayerStack
from .windows import Window

Method = Literal["hidden_states", "hooks"]
METHODS: tuple[str, ...] = ("hidden_states", "hooks")


def collate(
    items: Sequence[EncodedInput | Window], *, pad_id: int, with_token_types: bool, device: torch.device
) -> dict[str, torch.Tensor]:
    """Pad a batch to its own longest item (never beyond)."""
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
    Hidden state 0 is read at the input of the first layer, so at least one layer always runs."""
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
        output = model(**batch, **kwargs)
    if method == "hidden_states":
        states = output.hidden_states
        if len(states) != depth + 1:
            raise RuntimeError(f"model returned {len(states)} hidden states after {depth} layers")
    else:
        states = recorder.hidden
    hidden = torch.stack([states[i] for i in layers])
    tapped = {t: torch.stack([recorder.taps[t][i] for i in tap_layers]) for t in taps if tap_layers}
    return hidden, tapped


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", dtype=torch.float32).numpy()


Rows = list[tuple[np.ndarray, dict[str, np.ndarray]]]


def split_rows(hidden: torch.Tensor, tapped: Mapping[str, torch.Tensor], lengths: Sequence[int]) -> Rows:
    """Cut a padded batch into per-row arrays without padding: ``(hidden (L, n, H), taps)``."""
    hidden_np = _to_numpy(hidden)
    taps_np = {name: _to_numpy(t) for name, t in tapped.items()}
    rows = []
    for row, n in enumerate(lengths):
        taps = {}
        for name, array in taps_np.items():
            if name == "attention_probs":
                taps[name] = np.ascontiguousarray(array[:, row, :, :n, :n])
            else:
                taps[name] = np.ascontiguousarray(array[:, row, :n])
        rows.append((np.ascontiguousarray(hidden_np[:, row, :n]), taps))
    return rows


def segment_ids(sequence_ids: Sequence[int | None]) -> np.ndarray:
    """Segment (0 = first text, 1 = second) of every token, from the tokenizer's sequence ids.

    Not from ``type_ids``: RoBERTa-style tokenizers give both segments type id 0. Special tokens
    belong to the segment of the content token before them ([CLS] to 0, the [SEP] after A to 0,
    the final [SEP] to 1), which is BERT's token-type layout."""
    out = np.zeros(len(sequence_ids), dtype=np.int8)
    current = 0
    for position, sequence in enumerate(sequence_ids):
        if sequence is not None:
            current = sequence
        out[position] = current
    return out


def make_stack(
    item: EncodedInput,
    hidden: np.ndarray,
    taps: Mapping[str, np.ndarray],
    layers: Sequence[int],
    *,
    n_windows: int = 1,
) -> LayerStack:
    n = len(item)
    return LayerStack(
        hidden=hidden,
        layers=tuple(layers),
        tokens=item.tokens,
        offsets=np.asarray(item.offsets, dtype=np.int32).reshape(n, 2),
        word_ids=np.asarray([-1 if w is None else w for w in item.word_ids], dtype=np.int32),
        segment_ids=segment_ids(item.sequence_ids),
        text=item.text,
        text_pair=item.text_pair,
        words=item.words,
        truncated=item.truncated,
        words_lost=item.words_lost,
        n_windows=n_windows,
        taps=dict(taps),
        tap_layers=tuple(i for i in layers if i >= 1) if taps else (),
    )
