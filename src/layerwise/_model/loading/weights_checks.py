"""What a checkpoint lacks, or holds beyond its config: checked at every load, in memory
(source.py, light.py) and streamed (streaming/load.py), each named with the fix. transformers fills
weights a checkpoint lacks with random numbers and only logs it, and ignores weights it has no place
for; for a feature extractor either is a silent wrong number."""

from __future__ import annotations

import re
from typing import Any

from ...errors import ModelLoadError
from ..families.kinds import kind_of

# Weights a checkpoint may lack without changing any hidden state.
OPTIONAL_PREFIXES = ("pooler.",)
# Buffers older checkpoints saved and transformers now builds itself: left over, never a weight.
_REBUILT_BUFFERS = ("position_ids", "token_type_ids")


def _listed(keys: list[str], limit: int = 6) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" … ({len(keys)} in all)" if len(keys) > limit else "")


def unused_weights(stored: list[str], model_keys: set[str], base_prefix: str) -> list[str]:
    """Checkpoint keys of the encoder itself (its embeddings, layers, pooler; behind the base
    model's prefix when the checkpoint has one) that the model built from config.json has no place
    for: a config with fewer layers than the weights, or a checkpoint with an extra layer. Heads
    saved beside the encoder (``cls.``, ``lm_head.``, ``classifier.``) are not the encoder's."""
    roots = {key.split(".", 1)[0] for key in model_keys}
    unused = []
    for key in stored:
        local = key[len(base_prefix) :] if base_prefix and key.startswith(base_prefix) else key
        if local in model_keys or local.rsplit(".", 1)[-1] in _REBUILT_BUFFERS:
            continue
        if local.split(".", 1)[0] in roots:
            unused.append(key)
    return sorted(unused)


def _missing_weights(model: Any, missing_keys: Any) -> list[str]:
    """The weights a checkpoint lacks that a run would read as random numbers. Not among them: the
    pooler (never used); what transformers computes rather than loads (its class's own
    ``_keys_to_ignore_on_load_missing``: Marian's sinusoidal positions); of an encoder-decoder, the
    decoder's (only the encoder runs: a ``T5EncoderModel`` checkpoint has none)."""
    ignored = getattr(type(model), "_keys_to_ignore_on_load_missing", None) or ()
    base = getattr(model, "base_model_prefix", "") or ""
    computed = [re.compile(pattern) for pattern in ignored]
    missing = [
        k
        for k in missing_keys
        if not k.startswith(OPTIONAL_PREFIXES)
        and not any(p.search(k) or p.search(f"{base}.{k}") for p in computed)
    ]
    if kind_of(model.config) == "encoder-decoder":
        encoder = {id(t) for t in model.get_encoder().state_dict(keep_vars=True).values()}
        state = model.state_dict(keep_vars=True)
        missing = [k for k in missing if k not in state or id(state[k]) in encoder]
    return sorted(missing)


def check_unused(unused: list[str], name: str) -> None:
    """Refuse weights of the model's own that its config has no place for (in memory and streamed)."""
    if unused:
        raise ModelLoadError(
            f"model {name!r}: {len(unused)} weights of the checkpoint are not used by its config.json and "
            f"would be ignored: {_listed(unused)}. The config and the weights do not belong together "
            "(e.g. num_hidden_layers is smaller than the checkpoint's layers): use the config the weights "
            "were saved with"
        )


def check_loading_info(model: Any, info: dict, name: str) -> None:
    """Refuse, naming them, weights transformers' load left random, ignored or reshaped."""
    missing = _missing_weights(model, info.get("missing_keys", ()))
    if missing:
        unexpected = sorted(info.get("unexpected_keys", ()))
        hint = ""
        if unexpected:
            hint = (
                f" The checkpoint holds other keys instead, e.g. {unexpected[0]!r}: weights saved under a "
                "wrapper's prefix must be renamed to the model's own names."
            )
        raise ModelLoadError(
            f"model {name!r}: {len(missing)} weights are missing from the checkpoint and would be random: "
            f"{_listed(missing)}.{hint} Use a complete checkpoint of this architecture."
        )
    model_keys = set(model.state_dict())
    prefix = f"{model.base_model_prefix}." if getattr(model, "base_model_prefix", "") else ""
    check_unused(unused_weights(sorted(info.get("unexpected_keys", ())), model_keys, prefix), name)
    mismatched = info.get("mismatched_keys") or []
    if mismatched:
        raise ModelLoadError(
            f"model {name!r}: weights with the wrong shape: {_listed([str(m) for m in mismatched])}"
        )
