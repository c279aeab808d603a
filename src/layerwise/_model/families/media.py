"""Which models read images or sound, and what their units are: the media families' table.

An image transformer of the ViT layout cuts its input into patches on a grid and puts a few units
before them (a [CLS] token; DeiT's distillation token; DINOv2's registers). Every layer then holds
one vector per unit, and transformers' ``output_hidden_states`` returns the embedding output and
each layer's, as for a text encoder: layerwise reads them as it reads a text's tokens. A row here
says which units come before the patches; sizes (patch size, register count) come from the config.
A speech encoder's units are frames of time (wav2vec2, HuBERT, WavLM, Whisper's encoder): its
convolutions' strides say how long each is.

A hierarchical model whose stages change width and merge patches (Swin, ConvNeXt, PVT, …) has no
one vector per patch at every layer, and is refused by name (:func:`check_media_model`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ...errors import ModelLoadError

Modality = Literal["text", "image", "audio"]
MEDIA_PAGE = "docs/guide/media.md"


@dataclass(frozen=True)
class MediaFamily:
    """One family of image models: its units before the patches (``prefix``: kinds, in order; a
    config field that counts registers adds that many ``register`` units after them), and checkpoints
    it covers (docs/models.md)."""

    modality: Modality
    prefix: tuple[str, ...]
    examples: str
    registers: str | None = None  # the config field that counts register tokens

    def prefix_of(self, config: Any) -> tuple[str, ...]:
        """The kinds of the units before the patches, for ``config``."""
        extra = int(getattr(config, self.registers, 0) or 0) if self.registers else 0
        return self.prefix + ("register",) * extra


_CLS = ("cls",)
MEDIA_FAMILIES: dict[str, MediaFamily] = {
    "vit": MediaFamily("image", _CLS, "google/vit-base-patch16-224-in21k"),
    "vit_msn": MediaFamily("image", _CLS, "facebook/vit-msn-small"),
    "deit": MediaFamily("image", ("cls", "distillation"), "facebook/deit-base-distilled-patch16-224"),
    "beit": MediaFamily("image", _CLS, "microsoft/beit-base-patch16-224-pt22k"),
    "data2vec-vision": MediaFamily("image", _CLS, "facebook/data2vec-vision-base"),
    "dinov2": MediaFamily("image", _CLS, "facebook/dinov2-small … giant"),
    "dinov2_with_registers": MediaFamily(
        "image", _CLS, "facebook/dinov2-with-registers-small", registers="num_register_tokens"
    ),
    "ijepa": MediaFamily("image", (), "facebook/ijepa_vith14_1k"),
    "clip_vision_model": MediaFamily("image", _CLS, "openai/clip-vit-base-patch32's vision tower"),
    "siglip_vision_model": MediaFamily("image", (), "google/siglip-base-patch16-224's vision tower"),
    # speech: a convolutional feature encoder (its strides: 20 ms per frame at 16 kHz), then layers
    "wav2vec2": MediaFamily("audio", (), "facebook/wav2vec2-base, wav2vec2-large-xlsr-53"),
    "hubert": MediaFamily("audio", (), "facebook/hubert-base-ls960"),
    "wavlm": MediaFamily("audio", (), "microsoft/wavlm-base-plus"),
    "data2vec-audio": MediaFamily("audio", (), "facebook/data2vec-audio-base"),
    "unispeech": MediaFamily("audio", (), "microsoft/unispeech-large-1500h-cv"),
    "unispeech-sat": MediaFamily("audio", (), "microsoft/unispeech-sat-base-plus"),
    "wav2vec2-conformer": MediaFamily("audio", (), "facebook/wav2vec2-conformer-rope-large"),
    # log-mel frames of a fixed 30 s window, two convolutions (the second of stride 2): 20 ms per frame
    "whisper": MediaFamily("audio", (), "openai/whisper-tiny … large-v3's encoder"),
}
# two-tower models whose vision tower is one of the rows above, loaded by its own class
TOWERS = {"clip": "clip_vision_model", "siglip": "siglip_vision_model"}
# image models whose stages merge patches and change width: no one vector per patch at every layer
# (a table of model types, kept in rows)
HIERARCHICAL = (
    "swin", "swinv2", "donut-swin", "convnext", "convnextv2", "dinov3_convnext", "focalnet", "pvt",
    "pvt_v2", "hiera", "levit", "cvt", "dinat", "poolformer", "mobilevit", "mobilevitv2", "efficientnet",
    "regnet", "resnet", "bit", "mobilenet_v1", "mobilenet_v2", "segformer", "swiftformer",
)  # fmt: skip


def media_family(model_type: str | None) -> MediaFamily | None:
    """The row of ``model_type`` (a two-tower model's: its vision tower's), or None for a text model."""
    model_type = TOWERS.get(model_type or "", model_type or "")
    return MEDIA_FAMILIES.get(model_type)


def modality_of_source(source: str) -> Modality:
    """What the model at ``source`` (a folder, a hub name in the local cache, a GGUF file) reads,
    from its config.json's ``model_type`` alone: cheap enough to ask before anything loads. A
    source whose config cannot be found here is a text model's to load (and to report)."""
    config = _config_file(source)
    if config is None:
        return "text"
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return "text"  # the text loader reads it again and names what is wrong
    family = media_family(model_type)
    return family.modality if family is not None else "text"


def _config_file(source: str) -> Path | None:
    path = Path(source)
    if path.is_dir():
        return path / "config.json" if (path / "config.json").is_file() else None
    if path.suffix == ".gguf" or path.exists():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return None
    found = try_to_load_from_cache(source, "config.json")
    return Path(found) if isinstance(found, str) else None


# image and speech types refused for a reason of their own (the others: not one of the families)
OTHER_REASONS = {
    "vit_mae": "ViT-MAE keeps a random subset of its patches, in a random order, in every forward "
    "(mask_ratio, noise), so two runs of one image differ",
    "sew": "SEW's layers read frames pooled squeeze_factor at a time, whose times layerwise has not checked",
    "sew-d": "SEW-D's layers read frames pooled squeeze_factor at a time, whose times layerwise has not "
    "checked",
    **dict.fromkeys(
        ("videomae", "vivit", "timesformer", "videoprism_vision_model"),
        "it reads video (frames over time), and layerwise reads images and sound",
    ),
}


def families_named() -> str:
    """The media families, for a refusal's "layerwise reads …"."""
    return f"{', '.join(sorted(MEDIA_FAMILIES))}, and the vision towers of {', '.join(sorted(TOWERS))}"


def check_media_model(model_type: str, name: str) -> None:
    """Refuse, naming the reason and what runs instead, an image model with no one vector per
    patch at every layer, and the image, video and speech types with a reason of their own."""
    if model_type in OTHER_REASONS:
        raise ModelLoadError(
            f"model {name!r} is a {model_type!r} model: {OTHER_REASONS[model_type]}. layerwise reads "
            f"{families_named()} ({MEDIA_PAGE})"
        )
    if model_type in HIERARCHICAL:
        raise ModelLoadError(
            f"model {name!r} is a {model_type!r} model: a hierarchical image model, whose stages merge "
            "patches and change width, so its layers hold no one vector per patch. layerwise reads image "
            "transformers that keep every patch at every layer: "
            f"{', '.join(sorted(MEDIA_FAMILIES))} ({MEDIA_PAGE})"
        )


_FRAMES = {
    False: "frames of 20 ms (each sees 25 ms), the whole clip",
    True: "frames of 20 ms, those of the audio given (a 30 s window)",
}
_UNIT_NAMES = {"cls": "`[CLS]`", "distillation": "`[DIST]` (distillation)", "register": "the registers"}


def media_docs_rows() -> list[list[str]]:
    """docs/models.md's table of the image families: model types, modality, the units before the
    patches, example checkpoints; consecutive families alike share a row."""
    rows: list[list[str]] = []
    for name, row in MEDIA_FAMILIES.items():
        kinds = (*row.prefix, *(("register",) if row.registers else ()))
        before = ", ".join(_UNIT_NAMES[k] for k in kinds)
        units = f"{before}; then the patches, row by row" if before else "the patches alone, row by row"
        if row.modality == "audio":
            units = _FRAMES[name == "whisper"]
        cells = [row.modality, units, row.examples]
        if rows and rows[-1][1:3] == cells[:2] and name.split("_")[0] in rows[-1][0]:
            rows[-1][0] += f", `{name}`"
            rows[-1][3] += f", {row.examples}"
            continue
        rows.append([f"`{name}`", *cells])
    towers = ", ".join(f"`{t}`" for t in TOWERS)
    rows.append([f"{towers} (two towers)", "image", "as their vision towers above", "runs the vision tower"])
    return rows
