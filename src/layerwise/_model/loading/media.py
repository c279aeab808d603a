"""An image or a speech model and its own processor, loaded from one Settings.

The processor is the model's (``AutoImageProcessor``: the resize, crop and normalisation it was
trained with; ``AutoFeatureExtractor``: a speech model's normalisation or log-mel spectrogram),
never one of ours; Pillow's backend where torchvision is missing, whose numbers transformers holds
to the torchvision one. A two-tower model (CLIP, SigLIP) loads its vision tower by its own class,
and Whisper its encoder alone. Options that only the text path has (the packed forward,
streaming, a device map, quantised weights, a model's own code) are refused by name: a media model
runs transformers' own forward, in memory.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

import torch

from ..._settings.extras import require
from ...errors import ModelLoadError, OptionError
from ..families.media import TOWERS, MediaFamily, check_media_model, media_family
from ..notes import note
from .source import pick_device, quiet_transformers
from .weights_checks import OPTIONAL_PREFIXES

logger = logging.getLogger("layerwise")
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_TEXT_ONLY = {  # settings the media path has no use for, and the value that says "not used"
    "streaming": (None, False),
    "device_map": (None,),
    "offload_folder": (None,),
    "quantize": ("none",),
    "trust_remote_code": (False,),
    "max_device_memory": (None,),
    "stream_block_tokens": (None,),
    "max_tokens": (None,),  # batch_size says how many images or clips share a batch
    "concurrent_forwards": (None,),
    "method": ("hidden_states",),  # its states come from output_hidden_states
}


@dataclass(frozen=True)
class LoadedMedia:
    """An image or a speech model ready to run: transformers' model (eval, on its device; Whisper's
    encoder), its processor, its family row and config."""

    model: Any
    processor: Any
    family: MediaFamily
    config: Any
    device: torch.device
    dtype: torch.dtype
    name: str

    # what the store, the cache and the server read of a text model's handle (_model/handle.py)
    takes_final_norm = False  # its states are read as transformers gives them

    @property
    def current(self) -> Any:
        return self.model

    @property
    def n_layers(self) -> int:
        config = self.config
        return int(getattr(config, "encoder_layers", None) or config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(getattr(self.config, "d_model", None) or self.config.hidden_size)

    @property
    def rate(self) -> int:
        """A speech model's sampling rate (its feature extractor's), in Hz."""
        return int(self.processor.sampling_rate)

    @property
    def described(self) -> str:
        return f"model {self.name!r} ({self.config.model_type})"

    def transformers(self) -> Any:
        return self.model

    def check_final_norm(self, value: object) -> None:
        if value == "all":
            raise OptionError(
                f"final_norm='all': {self.described} reads {self.family.modality}; its states are read as "
                "transformers gives them. Leave final_norm unset"
            )


def load_media(settings: Any, source: str, name: str) -> LoadedMedia:
    """The image or speech model at ``source`` and its processor, as ``settings`` say (device,
    model dtype)."""
    from ..families.media import modality_of_source

    modality = modality_of_source(source)
    require("vision" if modality == "image" else "audio")  # Pillow; soundfile and SciPy: first
    for field, unused in _TEXT_ONLY.items():
        value = getattr(settings, field)
        if value not in unused:
            raise OptionError(
                f"{field}={value!r}: model {name!r} reads images and runs transformers' own forward, in "
                f"memory; leave {field} unset for it"
            )
    with quiet_transformers():
        loaded = _load(source, name, settings, modality)
    model, processor, family = loaded
    device = pick_device(settings.device)
    model.to(device).eval()
    dtype = TORCH_DTYPES[settings.model_dtype]
    return LoadedMedia(model, processor, family, model.config, device, dtype, name)


def _load(source: str, name: str, settings: Any, modality: str) -> tuple[Any, Any, MediaFamily]:
    """The model (on the CPU, in the settings' dtype), its processor and family row."""
    from transformers import AutoConfig, AutoFeatureExtractor, AutoImageProcessor, AutoModel

    config = AutoConfig.from_pretrained(source)
    check_media_model(str(config.model_type), name)
    family = media_family(config.model_type)
    if family is None:  # modality_of_source said image: its config.json and this disagree
        raise ModelLoadError(f"model {name!r} is a {config.model_type!r} model: not an image model here")
    dtype = TORCH_DTYPES[settings.model_dtype]
    backend = {} if importlib.util.find_spec("torchvision") else {"backend": "pil"}
    kind = "AutoImageProcessor" if modality == "image" else "AutoFeatureExtractor"
    try:
        if modality == "image":
            processor = AutoImageProcessor.from_pretrained(source, **backend)
        else:
            processor = AutoFeatureExtractor.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"model {name!r} has no processor (preprocessor_config.json): {exc}; save the one it was "
            f"trained with beside the weights ({kind}.save_pretrained)"
        ) from exc
    model_class: Any = AutoModel
    if config.model_type in TOWERS:  # the vision tower alone, from the two-tower checkpoint
        import transformers

        tower = {"clip": "CLIPVisionModel", "siglip": "SiglipVisionModel"}[config.model_type]
        model_class = getattr(transformers, tower)
    model, info = model_class.from_pretrained(source, dtype=dtype, output_loading_info=True)
    if config.model_type == "whisper":  # the encoder alone: the decoder is never run
        model = model.get_encoder()
        info = {"missing_keys": [k for k in info.get("missing_keys", ()) if k.startswith("encoder.")]}
    if any(k.startswith(OPTIONAL_PREFIXES) for k in info.get("missing_keys", ())):
        note(model, "not_loaded", OPTIONAL_PREFIXES)  # a random pooler: not what names the weights
    missing = [k for k in info.get("missing_keys", ()) if not k.startswith(OPTIONAL_PREFIXES)]
    if missing:
        raise ModelLoadError(
            f"model {name!r}: its checkpoint lacks {len(missing)} weight(s) ({', '.join(missing[:3])}); "
            "it is incomplete or of another architecture: download it again"
        )
    return model, processor, family
