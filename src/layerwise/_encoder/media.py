"""An Encoder of an image or a speech model: the same calls as a text model's, with images or
sound for texts.

    enc = lw.Encoder("google/vit-base-patch16-224-in21k")   # an Encoder whose inputs are images
    stack = enc.extract("cat.jpg")                           # (13, 197, 768): [CLS], then 14 x 14 patches
    stack.units.grid[1]                                      # (0, 0): the top-left patch's row and column
    enc.embed(["cat.jpg", "dog.png"], pool="cls")            # (2, 13, 768)
    speech = lw.Encoder("facebook/hubert-base-ls960")        # its inputs are audio: frames of 20 ms
    speech.extract("talk.flac").units.times[:2]              # [[0, 0.025], [0.02, 0.045]] seconds

``Encoder(model)`` makes one of these when the model's config says it reads images or sound
(families/media.py); every call whose arguments are texts takes them there (paths, bytes, PIL
images, arrays), and every consumer of results (the writers, the store, the analyses) takes its
stacks. The model runs transformers' own forward (_engine/media.py, _engine/audio.py); its
processor is the model's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .._engine.audio import AudioRun
from .._engine.host_copy import RESULT_DTYPES
from .._engine.media import MediaRun
from .._features.layers import LayerSpec, resolve_layers
from .._features.plan import OutputPlan, Result
from .._model.loading.media import load_media
from .._model.loading.source import resolve_model_source
from .._results import LayerStack
from .._settings.long_texts import LONG_TEXTS
from .._settings.settings import Settings, as_settings, settings_of
from .._version import __version__
from ..errors import InputError, OptionError, check_choice
from .features import FeatureCalls

CPU_BATCH_SIZE, GPU_BATCH_SIZE = 32, 256  # images or clips per batch
_CONTENT = {"image": "patch", "audio": "frame"}  # the kind of a modality's content units


class MediaEncoder(FeatureCalls):
    """An :class:`~layerwise.Encoder` whose inputs are images or sound: ``Encoder(model)`` makes it
    for an image or a speech model, and it is an Encoder (registered as one: ``isinstance(enc,
    lw.Encoder)``), with the same calls and properties. ``modality`` says what it reads ("image" or
    "audio"); ``family`` its row of the media table."""

    def __init__(self, model: Settings | str | os.PathLike | None = None, **options: Any) -> None:
        given = settings_of(model, options)
        source, name = resolve_model_source(given.model)
        loaded = load_media(given, source, name)
        loaded.check_final_norm(given.final_norm)
        self.loaded, self.models, self.source, self.name = loaded, loaded, source, name
        self.settings = given.replace(model=name)
        self._config, self.tokenizer, self.inputs = loaded.config, None, None
        self.processor = loaded.processor  # the model's own (AutoImageProcessor, AutoFeatureExtractor)
        self.is_decoder, self.sentence_transformers = False, None
        self.modality, self.family = loaded.family.modality, loaded.family
        self.model_type = str(loaded.config.model_type)
        self.n_layers, self.hidden_size = loaded.n_layers, loaded.hidden_size
        on_cpu = loaded.device.type == "cpu"
        self._batch_size = given.batch_size or (CPU_BATCH_SIZE if on_cpu else GPU_BATCH_SIZE)
        check_max_length(given.max_length, loaded)
        self.run: MediaRun | AudioRun = (
            MediaRun(loaded, self._batch_size, given.allow_nan)
            if self.modality == "image"
            else AudioRun(loaded, self._batch_size, given.allow_nan, given.max_length)
        )
        self.engine = None

    @classmethod
    def from_settings(cls, settings: Settings) -> MediaEncoder:
        return cls(as_settings(settings))

    @property
    def device(self) -> torch.device:
        return self.loaded.device

    @property
    def model_dtype(self) -> str:
        return self.settings.model_dtype

    @property
    def method(self) -> str:
        return self.settings.method

    @property
    def final_norm(self) -> Any:  # recorded as none: the states are read as transformers gives them
        return self.settings.final_norm

    @property
    def n_hidden_states(self) -> int:  # the embedding output plus one per layer
        return self.n_layers + 1

    @property
    def max_length(self) -> int:
        """Units per input: an image's at the model's own size; Whisper's frames in 30 s; 0 for a
        speech model without a limit (wav2vec2: a clip is read whole)."""
        return self.run.max_units

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def max_tokens(self) -> int:
        return self._batch_size * self.max_length

    @property
    def config(self) -> Any:
        return self._config

    @property
    def model(self) -> Any:
        return self.loaded.model

    @property
    def streamed(self) -> bool:
        return False

    @property
    def run_path(self) -> str:
        return "general"

    def __repr__(self) -> str:
        return (
            f"Encoder({self.name!r}, modality={self.modality!r}, n_layers={self.n_layers}, "
            f"hidden_size={self.hidden_size}, device='{self.device}')"
        )

    def one_input(self, value: object) -> bool:
        """Whether ``value`` is one input: a path, bytes, a PIL image, an array of one image or one
        clip, a clip's ``(array, rate)``."""
        if isinstance(value, np.ndarray):
            return value.ndim in ((2, 3) if self.modality == "image" else (1,))
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], np.ndarray):
            return self.modality == "audio"
        return isinstance(value, str | os.PathLike | bytes) or hasattr(value, "getpixel")

    def settle(self, plan: OutputPlan) -> OutputPlan:
        """``plan`` checked against an image model: token or sentence level, a pool its units have
        (``cls`` needs a [CLS] unit), no windows; its final norm recorded as none."""
        self.check_windows(plan.long_texts, plan.stride)
        return settle_media_plan(
            plan, self.family, self.name, self.model_type, self.n_hidden_states, self.final_norm
        )

    def check_windows(self, long_texts: str, stride: int | None) -> None:
        """An image is read whole: long_texts "window" (every unit kept) holds for it, and never
        slides. A clip longer than the frames one forward reads slides in windows ``stride`` frames
        apart (_engine/audio.py)."""
        check_choice("long_texts", long_texts, LONG_TEXTS)
        if stride is None:
            return
        if self.modality == "image":
            raise OptionError(f"stride={stride}: windows slide over long inputs; an image is read whole")
        limit = self.run.max_units or None
        if long_texts != "window" or limit is None:
            raise OptionError(
                f"stride={stride} applies to windows: pass long_texts='window'"
                + ("" if limit else ", and max_length (a window's frames): this model reads a clip whole")
            )
        if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= limit:
            raise OptionError(f"stride={stride!r} must be a whole number of frames between 1 and {limit}")

    def run_settings(self) -> dict:
        return {**self.settings.as_dict(), "final_norm": None}

    def run_meta(self, plan: OutputPlan) -> dict:
        """How a run of ``plan`` is made (every output's metadata): the text path's fields, and the
        modality and units."""
        from .._model.loading.weights_hash import weights_sha256

        settled = self.settle(plan)
        return {
            "layerwise_version": __version__,
            **self.run_settings(),
            "model_source": str(self.source),
            "device_used": str(self.device),
            "max_length": self.max_length,
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "streaming": False,
            "packed": False,
            "forward": "general",
            "modality": self.modality,
            "units": sorted({*self.family.prefix_of(self.config), _CONTENT[self.modality]}),
            # a frame's stride and span in seconds: the store's readers give each frame its times
            "frame_seconds": self.run.frame_seconds if isinstance(self.run, AudioRun) else None,
            "weights_sha256": weights_sha256(self.loaded.model),
            "hidden_size": self.hidden_size,
            "decoder": False,
            **settled.meta(self.n_hidden_states),
        }

    def iter_results(
        self, plan: OutputPlan, texts: Sequence[Any] | None = None, **inputs: Any
    ) -> Iterator[tuple[int, LayerStack, Result]]:
        settled = self.settle(plan)
        items = self._items(texts, inputs)
        layers, window = settled.hidden_states(self.n_hidden_states), settled.long_texts == "window"
        stream = self.run.stacks(items, layers, "float32", window=window, step=settled.stride)
        return ((index, stack, settled.result(stack, self.n_hidden_states)) for index, stack in stream)

    def iter_batches(self, plan: OutputPlan, texts: Sequence[Any] | None = None, **inputs: Any) -> tuple:
        return None, self.settle(plan).hidden_states(self.n_hidden_states)

    def tokenize(self, texts: Any = None, **inputs: Any) -> list:
        raise OptionError(f"model {self.name!r} reads {self.modality}; it has no tokenizer")

    def iter_extract(
        self,
        texts: Sequence[Any] | None = None,
        *,
        layers: LayerSpec = "all",
        batch_size: int | None = None,
        dtype: str = "float32",
        final_norm: Any = None,
        long_texts: str = "truncate",
        stride: int | None = None,
        **inputs: Any,
    ) -> Iterator[tuple[int, LayerStack]]:
        """``(input index, LayerStack)`` as batches finish (see :meth:`extract`)."""
        check_choice("dtype", dtype, tuple(RESULT_DTYPES))
        self.loaded.check_final_norm(final_norm)
        self.check_windows(long_texts, stride)
        layer_ids = resolve_layers(layers, self.n_hidden_states)
        items = self._items(texts, inputs)
        window = long_texts == "window"
        return self.run.stacks(items, layer_ids, dtype, batch_size, window=window, step=stride)

    def extract(self, texts: Any = None, **options: Any) -> Any:
        """Hidden states of every requested layer of each image: a :class:`LayerStack` per input
        (one for one image), ``hidden`` of shape ``(layers, units, hidden)``, ``units`` saying
        which is which. ``layers``, ``batch_size`` and ``dtype`` as for a text model."""
        single = self.one_input(texts)
        results = dict(self.iter_extract([texts] if single else texts, **options))
        ordered = [results[i] for i in range(len(results))]
        return ordered[0] if single else ordered

    def _items(self, texts: Any, inputs: dict[str, Any]) -> list[Any]:
        """The call's images, as a list: text-only inputs (pairs, pre-split words, taps, windows)
        are refused by name."""
        given = {k: v for k, v in inputs.items() if v not in (None, (), False)}
        given.pop("progress", None)
        given.pop("report_truncation", None)
        if given:
            raise InputError(
                f"{', '.join(sorted(given))}: text options; model {self.name!r} reads {self.modality} "
                "(pass paths, bytes or arrays)"
            )
        if texts is None:
            raise InputError(f"model {self.name!r} reads {self.modality}: pass a list of paths or arrays")
        if self.one_input(texts):
            raise InputError("pass a list of inputs (one input: extract(it) returns its LayerStack)")
        return list(texts)


def settle_media_plan(
    plan: OutputPlan, family: Any, name: str, model_type: str, n_hidden_states: int, final_norm: Any
) -> OutputPlan:
    """``plan`` checked against an image or a speech model of ``family`` (its layers, a level and a
    pool its units have) and its final norm recorded as none: MediaEncoder.settle, and Ray's driver
    before any actor starts."""
    plan.hidden_states(n_hidden_states)
    modality = family.modality
    what = "an image" if modality == "image" else "a clip"
    if plan.level == "word":
        units = "patches" if modality == "image" else "frames of time"
        raise OptionError(
            f"level='word': {what} has no words; its units are {units}. Take level='token' (every "
            "unit, with its place) or a sentence pool (mean; cls where the model has [CLS])"
        )
    if plan.level == "sentence" and plan.mode == "last":
        raise OptionError(f"pool='last' reads a decoder's last token; for {what} take mean")
    if plan.level == "sentence" and plan.mode == "cls" and "cls" not in family.prefix:
        raise OptionError(
            f"pool='cls': model {name!r} ({model_type}) has no [CLS] unit, only patches; take pool='mean'"
        )
    return plan.with_final_norm(final_norm, takes=False, name=name)


def check_max_length(value: int | None, loaded: Any) -> None:
    """``max_length`` where it means something: the frames one forward of a wav2vec2-style model
    reads (longer clips are cut there, or windowed); an image's units are its processor's, and
    Whisper reads its own 30-second window."""
    if value is None:
        return
    if loaded.family.modality == "image" or loaded.config.model_type == "whisper":
        fixed = "an image's units are fixed by its processor"
        if loaded.family.modality != "image":
            fixed = "Whisper reads a 30-second window (1500 frames); long_texts='window' slides it"
        raise OptionError(f"max_length={value}: {fixed}; leave max_length unset for model {loaded.name!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise OptionError(f"max_length={value!r}: the frames one forward reads, a whole number of 2 or more")
