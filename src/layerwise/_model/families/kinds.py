"""What kind of text transformer a config describes, read from transformers' own mappings.

layerwise runs any Hugging Face model that reads token ids through attention layers and returns
one hidden state per layer. Whether it is a **decoder** (causal attention, last-token pooling, a
final norm, no sentence pairs), an **encoder**, or the encoder half of an **encoder-decoder** (T5,
BART: only its encoder runs) comes from transformers' model mappings and the config, never from a
list kept here:

- an encoder-decoder says so (``is_encoder_decoder``);
- a decoder has a causal-LM head and no masked-LM head (BERT, RoBERTa and BART have both; their
  causal head is a fine-tuning option, not how they were trained);
- everything else with a masked-LM, text-encoding or sequence-classification head is an encoder.

What cannot work is refused by name: a model without a text head of any kind (vision, audio), a
multimodal wrapper (its text model is another config). State-space and recurrent models (Mamba,
RWKV) run on the general path: each block's output is a hidden state. Which families the packed
forward runs, and which stream, are rows of the family table (table.py): each is a forward of our
own, tested against transformers (forward/, streaming/).
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from ...errors import ModelLoadError
from .table import packed_families

Kind = Literal["encoder", "decoder", "encoder-decoder"]
SUPPORTED_PAGE = "the table in docs/models.md"  # which families run how

# The encoders with BERT's module layout: the light model reads them (loading/light.py), the packed
# forward runs them (forward/packed.py), their taps have BERT's names (forward/hooks.py), and their
# config and tokenizer are read without transformers' registry (loading/plain.py). Their kind is
# known here without the mappings, whose import a one-line command would otherwise pay for
# (tests/test_start.py holds it to the mappings).
BERT_LAYOUT = packed_families("bert")


@functools.cache
def _mapping(name: str) -> frozenset[str]:
    """The model types of one of transformers' mappings (read once: ``is_decoder_config`` is asked
    for every padded batch)."""
    from transformers.models.auto import modeling_auto

    return frozenset(getattr(modeling_auto, name, {}))


def kind_of(config: Any) -> Kind:
    """Whether ``config`` is a decoder LM, an encoder, or an encoder-decoder (whose encoder runs)."""
    model_type = getattr(config, "model_type", None)
    if model_type in BERT_LAYOUT and not getattr(config, "auto_map", None):
        return "encoder"
    # a T5EncoderModel checkpoint's config says is_encoder_decoder=False: its type says what it is
    if getattr(config, "is_encoder_decoder", False) or (
        not _remote(config) and model_type in _mapping("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES")
    ):
        return "encoder-decoder"
    if _remote(config):  # the model's own code (trust_remote_code): its auto_map names its heads
        heads = set(getattr(config, "auto_map", None) or ())
        causal, masked = "AutoModelForCausalLM" in heads, "AutoModelForMaskedLM" in heads
    else:
        causal = model_type in _mapping("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES")
        masked = model_type in _mapping("MODEL_FOR_MASKED_LM_MAPPING_NAMES")
    return "decoder" if causal and not masked else "encoder"


def _remote(config: Any) -> bool:
    """Whether ``config`` is of a model whose code comes with it (``auto_map``), not transformers'."""
    auto_map = getattr(config, "auto_map", None) or {}
    return "AutoModel" in auto_map and getattr(config, "model_type", None) not in _mapping(
        "MODEL_MAPPING_NAMES"
    )


def is_decoder_config(config: Any) -> bool:
    """Whether ``config`` is a decoder language model (see :func:`kind_of`)."""
    return kind_of(config) == "decoder"


_TEXT_HEADS = (
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
)
# heads of models that read sound or pixels: a causal or seq2seq head there decodes text from them
_OTHER_INPUTS = (
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_CTC_MAPPING_NAMES",
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES",
)


def check_text_transformer(config: Any, name: str) -> None:
    """Refuse, naming its type and why, a model layerwise cannot read layer by layer."""
    model_type = getattr(config, "model_type", None)
    where = f"model {name!r} is a {model_type!r} model"
    if _remote(config):  # its own code (trust_remote_code): its hidden states are checked at load
        return
    if model_type not in _mapping("MODEL_MAPPING_NAMES"):
        raise ModelLoadError(
            f"{where}, which this version of transformers has no base model class for (AutoModel); upgrade "
            "transformers if the type is newer than it, "
            f"or pass a text transformer (the families layerwise runs: {SUPPORTED_PAGE})"
        )
    if any(hasattr(config, part) for part in ("vision_config", "audio_config")):
        raise ModelLoadError(
            f"{where}: a multimodal model, whose text model has a config of its own; layerwise reads "
            "text transformers. Save its language model alone (model.language_model.save_pretrained) "
            f"and pass that folder ({SUPPORTED_PAGE})"
        )
    if model_type == "funnel":
        raise ModelLoadError(
            f"{where}: its hidden states change shape between layers (Funnel pools the sequence between its "
            f"blocks); layerwise reads one state per token at every layer ({SUPPORTED_PAGE})"
        )
    if model_type == "xmod" and not getattr(config, "default_language", None):
        raise ModelLoadError(
            f"{where}: X-MOD runs each text through the language adapter of its language, and its "
            'config.json names no default_language; set it there (e.g. "default_language": "en_XX")'
        )
    from .media import check_media_model, families_named  # only here: a refusal's reasons

    check_media_model(str(model_type), name)  # a hierarchical image model: refused with its reason
    other = any(model_type in _mapping(m) for m in _OTHER_INPUTS)
    if other or not any(model_type in _mapping(m) for m in _TEXT_HEADS):
        raise ModelLoadError(
            f"{where}, which does not read text (an image, audio or other model) and is not of the image "
            "and speech families layerwise reads, each checked against transformers: "
            f"{families_named()} ({SUPPORTED_PAGE})"
        )
