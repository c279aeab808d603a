"""Every image and speech type of transformers' image and audio mappings, loaded by layerwise: the
media families built tiny and random (media_models.py, audio_models.py) and compared with
transformers' ``output_hidden_states``; every other type, from its config class's defaults, must be
refused by name with its reason (tests/test_sweep_media.py).

The outcome of a type is ``equal`` (every hidden state within 1e-5 of transformers', read alone),
``refused`` (an error naming the type, with the reason: ``hierarchical``, ``multimodal``, ``other``
for a reason of its own, ``not a family``), ``skipped`` (transformers cannot build the type's
config), or ``wrong``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

# the mappings whose types read images or sound
MAPPINGS = (
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_MAPPING_NAMES",
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_CTC_MAPPING_NAMES",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_AUDIO_XVECTOR_MAPPING_NAMES",
)
# the words of each refusal's reason, as the error says it
REASONS = {
    "hierarchical": "a hierarchical image model",
    "multimodal": "a multimodal model",
    "no AutoModel": "has no base model class for (AutoModel)",
    "not a family": "is not of the image and speech families layerwise reads",
    "other": ". layerwise reads",  # a reason of its own (families/media.py OTHER_REASONS), then the families
}
WAV2VEC2_LIKE = {  # speech types of wav2vec2's layout, with their config classes' names
    "unispeech": "UniSpeechConfig",
    "unispeech-sat": "UniSpeechSatConfig",
    "wav2vec2-conformer": "Wav2Vec2ConformerConfig",
}


def media_types() -> list[str]:
    """Every type of :data:`MAPPINGS`, sorted."""
    from transformers.models.auto import modeling_auto

    found: set[str] = set()
    for mapping in MAPPINGS:
        found |= set(getattr(modeling_auto, mapping, {}))
    return sorted(found)


def sweep_one(model_type: str, folder: Path) -> dict[str, Any]:
    """The outcome of ``model_type`` (see the module docstring), built in ``folder``."""
    from media_models import MEDIA_TYPES

    from layerwise._model.families.media import MEDIA_FAMILIES, TOWERS

    if model_type in MEDIA_TYPES or model_type in TOWERS:
        return _compare_image(model_type, folder)
    if model_type in MEDIA_FAMILIES:
        return _compare_audio(model_type, folder)
    return _refusal(model_type, folder)


def _compare_image(model_type: str, folder: Path) -> dict[str, Any]:
    from media_models import reference_states, save_image_model, save_images

    import layerwise as lw

    images = save_images(folder / "images")
    model_class = None
    if model_type in ("clip", "siglip"):
        model_class = _save_two_tower(model_type, folder / "model")
    else:
        save_image_model(model_type, folder / "model")
    expected = reference_states(folder / "model", images, model_class)
    got = lw.Encoder(folder / "model", device="cpu").extract(images)
    return _outcome(model_type, [g.hidden for g in got], expected)


def _compare_audio(model_type: str, folder: Path) -> dict[str, Any]:
    from audio_models import clips, reference_states, save_audio_model

    import layerwise as lw

    if model_type in WAV2VEC2_LIKE:
        _save_wav2vec2_like(model_type, folder / "model")
    else:
        save_audio_model(model_type, folder / "model")
    waves = clips(3)
    expected = reference_states(folder / "model", waves)
    got = lw.Encoder(folder / "model", device="cpu").extract(waves)
    return _outcome(model_type, [g.hidden for g in got], expected)


def _outcome(model_type: str, got: list[np.ndarray], expected: list[np.ndarray]) -> dict[str, Any]:
    shapes = all(g.shape == e.shape for g, e in zip(got, expected, strict=True))
    diff = max(float(np.abs(g - e).max()) for g, e in zip(got, expected, strict=True)) if shapes else np.inf
    return {"type": model_type, "outcome": "equal" if diff <= 1e-5 else "wrong", "max_abs_diff": diff}


def _refusal(model_type: str, folder: Path) -> dict[str, Any]:
    """A type layerwise does not read, from its config class's defaults: refused, and why."""
    from transformers import AutoConfig

    import layerwise as lw

    try:
        config = AutoConfig.for_model(model_type)
        config.save_pretrained(folder)
    except Exception as exc:  # the config class needs arguments: nothing to load
        return {"type": model_type, "outcome": "skipped", "why": f"{type(exc).__name__}: {exc}"[:200]}
    try:
        lw.Encoder(folder, device="cpu")
    except Exception as exc:
        message = str(exc)
        reason = next((name for name, words in REASONS.items() if words in message), None)
        named = repr(config.model_type) in message  # "mlcd" builds an "mlcd_vision_model" config
        outcome = "refused" if reason is not None and named else "wrong"
        return {"type": model_type, "outcome": outcome, "reason": reason, "why": message[:300]}
    return {"type": model_type, "outcome": "wrong", "why": "loaded, and nothing compared it"}


def _save_two_tower(model_type: str, folder: Path) -> Any:
    """A tiny two-tower CLIP or SigLIP and its image processor; the vision tower's class."""
    import torch
    import transformers as T
    from media_models import SMALL, SQUARE

    text = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    vision = dict(**SMALL, intermediate_size=64)
    torch.manual_seed(0)
    if model_type == "clip":
        config = T.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
        T.CLIPModel(config).save_pretrained(folder)
        T.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size=SQUARE).save_pretrained(folder)
        return T.CLIPVisionModel
    T.SiglipModel(T.SiglipConfig(text_config=text, vision_config=vision)).save_pretrained(folder)
    T.SiglipImageProcessor(size=SQUARE).save_pretrained(folder)
    return T.SiglipVisionModel


def _save_wav2vec2_like(model_type: str, folder: Path) -> None:
    import torch
    import transformers as T
    from audio_models import RATE, SMALL

    extra = {"conv_depthwise_kernel_size": 3} if model_type == "wav2vec2-conformer" else {}
    config = getattr(T, WAV2VEC2_LIKE[model_type])(**SMALL, **extra, feat_extract_norm="layer")
    torch.manual_seed(0)
    T.AutoModel.from_config(config).save_pretrained(folder)
    T.Wav2Vec2FeatureExtractor(sampling_rate=RATE, return_attention_mask=True).save_pretrained(folder)


def sweep(types: list[str] | None = None) -> list[dict[str, Any]]:
    """The outcome of every type of :data:`MAPPINGS` (or of ``types``)."""
    outcomes = []
    for model_type in types or media_types():
        with tempfile.TemporaryDirectory() as tmp:
            outcomes.append(sweep_one(model_type, Path(tmp) / model_type))
    return outcomes
