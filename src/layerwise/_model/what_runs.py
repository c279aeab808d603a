"""What will run, said before any weight is read: for a model (``layerwise info -m``) its kind
(families/kinds.py), the path its forward takes, whether it streams, its taps and its final norm; for this
machine (``layerwise info``) its processor's units, the library its linear layers run on, the dtype
that runs fastest on its CPU, and its GPUs."""

from __future__ import annotations

import math
from typing import Any

from .._host.cpu import bf16_units, cpu_flags, cpu_name, fp16_units, usable_cores, vector_units
from ..errors import ModelLoadError
from .families.kinds import kind_of
from .families.table import family
from .final_norm import config_has_final_norm
from .forward.hooks import tap_paths
from .forward.packed import unpackable
from .forward.packed_decoder import PACKED_TAPS, runs_on_modules, unpackable_decoder
from .streaming.support import check_streamable


def describe(config: Any) -> dict[str, Any]:
    """What will run for ``config``, before any weight is read: its kind, the path (``packed``: our
    unpadded forward; ``general``: transformers' own forward of padded batches), whether it
    streams layer by layer, its sub-layer taps and its final norm (``layerwise info -m``)."""
    kind = kind_of(config)
    model_type = str(config.model_type)
    decoder = kind == "decoder"
    row = family(model_type)  # what layerwise knows of the family beyond transformers (families/table.py)
    why_not = unpackable_decoder(config) if runs_on_modules(config) else unpackable(config)
    try:
        check_streamable(config, model_type)
        streaming: str = "yes"
    except ModelLoadError:
        streaming = "no: load it in memory"
    taps = sorted(tap_paths(model_type))
    if decoder:
        taps = [t for t in taps if t in ("attention_probs", *PACKED_TAPS)]
        final_norm = "found by name and checked against transformers at load"
        if why_not is None:
            final_norm = "yes: final_norm True, False or 'all'"
    elif config_has_final_norm(config):  # T5's, ModernBERT's, mBART's
        final_norm = "yes: final_norm True, False or 'all' (checked against transformers at load)"
    else:
        final_norm = "none: the last state is the last layer's output (final_norm='all' is refused)"
    return {
        "model_type": model_type,
        "modality": "text",
        "units": "tokens",
        "kind": "encoder of an encoder-decoder" if kind == "encoder-decoder" else kind,
        "layers": int(config.num_hidden_layers),
        "hidden_size": int(config.hidden_size),
        "forward": "packed" if why_not is None else "general",
        "streaming": streaming,
        "positions": row.positions if row is not None and row.positions != "other" else "the model's own",
        "taps": ", ".join(taps) or "none (their module names are not in layerwise's table)",
        "final_norm": final_norm,
        "pairs": "no (join the texts yourself)" if decoder else "where the tokenizer has a pair template",
    }


def describe_media(config: Any) -> dict[str, Any]:
    """What will run for the config of an image or a speech model (``layerwise info -m``): its
    modality, its units (the ones before the patches, the grid of patches at the model's own image
    size; a speech model's frames), the path (transformers' own forward) and its pools."""
    from .families.media import TOWERS, media_family

    if config.model_type in TOWERS:  # a two-tower model: its vision tower runs
        config = config.vision_config
    row = media_family(config.model_type)
    assert row is not None
    if row.modality == "audio":
        return _describe_speech(config)
    size, patch = config.image_size, config.patch_size
    rows, cols = (size, size) if isinstance(size, int) else size
    step = (patch, patch) if isinstance(patch, int) else patch
    prefix = row.prefix_of(config)
    before = ", ".join(f"{prefix.count(k)} {k}" for k in dict.fromkeys(prefix)) or "none"
    grid = f"{rows // step[0]} x {cols // step[1]} patches of {step[0]} x {step[1]} pixels"
    return {
        "model_type": str(config.model_type),
        "modality": row.modality,
        "units": f"before the patches: {before}; then {grid} (at the model's {rows} x {cols} input)",
        "kind": "image encoder",
        "layers": int(config.num_hidden_layers),
        "hidden_size": int(config.hidden_size),
        "forward": "general",
        "streaming": "no: an image model is read in memory",
        "pools": "cls, mean (every unit), mean with special_tokens='exclude' (the patches), max"
        if "cls" in prefix
        else "mean, max (no [CLS] unit)",
        "taps": "none",
        "final_norm": "none: the states as transformers' output_hidden_states gives them",
        "preprocessing": "the model's own image processor (AutoImageProcessor)",
    }


def _describe_speech(config: Any) -> dict[str, Any]:
    whisper = config.model_type == "whisper"
    if whisper:
        units = "frames of 20 ms: those of the audio given, of a 30-second window (longer clips are cut)"
    else:
        stride = math.prod(config.conv_stride)
        units = f"frames of {stride} samples (20 ms at 16 kHz: its convolutions' strides), the whole clip"
    return {
        "model_type": str(config.model_type),
        "modality": "audio",
        "units": units,
        "kind": "speech encoder" + (" (Whisper's encoder; its decoder never runs)" if whisper else ""),
        "layers": int(config.encoder_layers if whisper else config.num_hidden_layers),
        "hidden_size": int(config.d_model if whisper else config.hidden_size),
        "forward": "general",
        "streaming": "no: a speech model is read in memory",
        "pools": "mean, max (no [CLS] unit); a time span: stack.units.during(start, end)",
        "taps": "none",
        "final_norm": "none: the states as transformers' output_hidden_states gives them",
        "preprocessing": "the model's own feature extractor (AutoFeatureExtractor); files decoded by "
        "soundfile and resampled to its rate",
    }


def describe_machine() -> dict[str, Any]:
    """What this machine offers a forward (``layerwise info``): the CPU, the cores this process may
    use and torch's threads, the vector and half-precision matrix units, the library the packed
    forward's linear layers run on (cpu_gemm.py), the fastest ``model_dtype`` on the CPU, and the GPUs."""
    import torch

    from .forward.cpu_gemm import onednn_usable

    bf16, fp16 = bf16_units(), fp16_units()
    known = bool(cpu_flags())  # /proc/cpuinfo read: an absent unit is absent, not unknown
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "cpu": cpu_name(),
        "cores": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "vector_units": vector_units() or "unknown",
        "bf16_units": bf16 or _absent("bfloat16", known),
        "fp16_units": fp16 or _absent("float16", known),
        "cpu_linear": "oneDNN, weights prepacked" if onednn_usable() else "MKL (F.linear)",
        "cpu_dtype": f"bfloat16 ({bf16}); float32 is the default" if bf16 else "float32 (the default)",
        "gpus": ", ".join(gpus) or "none",
        "torch": torch.__version__,
    }


def _absent(dtype: str, known: bool) -> str:
    if not known:
        return "unknown (no /proc/cpuinfo to read them from)"
    return f"none: model_dtype='{dtype}' runs several times slower than float32 here"
