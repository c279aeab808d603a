"""Encoder: a model and its fast tokenizer, ready to extract every layer.

    enc = Encoder()                        # the packaged all-MiniLM-L6-v2, offline
    enc = Encoder("bert-base-uncased")     # a Hugging Face name (from the local cache when offline)
    enc = Encoder("path/to/folder")        # a folder with config.json, weights and tokenizer files
    enc = Encoder("SmolLM2.Q4_1.gguf")     # a decoder LM (Llama, Qwen2, Mistral, Gemma, GPT-2), GGUF too
    stacks = enc.extract(["The bank raised rates."], layers="all")

The data flows one way: inputs (_inputs/) -> the engine (_engine/engine.py: batches, forward, windows)
-> LayerStacks (_results.py) -> an OutputPlan (plan.py) or the feature functions (features.py).
The Encoder holds the model and exposes the short public calls; it does no pooling itself.
Batching follows sentence-transformers' ``encode``: inputs sorted by token length, batched, run
under ``torch.inference_mode``, moved to the CPU batch by batch, and returned in input order.
"""

from __future__ import annotations

import logging
import os
from abc import ABCMeta
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import torch

from .._features.layers import LayerSpec
from .._features.plan import OutputPlan, Result
from .._inputs.encoding import EncodedBlock, EncodedInput
from .._inputs.raw import normalize_inputs
from .._model.loading.plain import transformers_config
from .._model.loading.source import reads_media
from .._results import LayerStack
from .._settings.long_texts import LongTexts
from .._settings.settings import FinalNorm, Method, ModelDtype, Settings, as_settings, settings_of
from ..errors import InputError
from .calls import make_call, plan_call, settled_plan, stream_batches, stream_stacks
from .features import FeatureCalls
from .loading import load
from .records import run_meta, run_settings
from .warm import warm_device

logger = logging.getLogger("layerwise")


class Encoder(FeatureCalls, metaclass=ABCMeta):
    """A BERT-family encoder or a decoder language model that returns every hidden state.

    ``Encoder(settings)``: a :class:`~layerwise.Settings`, the one value that says which model and
    how it runs. ``Encoder(model, **options)`` is the short form: ``model`` a hub name, a folder, a
    GGUF file, or None for the packaged all-MiniLM-L6-v2, and the options the other fields of
    Settings, which documents each (device, model_dtype, max_length, batch_size, max_tokens,
    packed, concurrent_forwards, allow_nan, final_norm, method, streaming, max_device_memory,
    stream_block_tokens, device_map, offload_folder, quantize, trust_remote_code).
    ``enc.settings`` says what it was made with, ``enc.engine.settings`` the same resolved for
    this model and device (what runs). Front ends batching across callers use ``inputs.encode``
    and ``engine.run_inputs`` directly. An image model's Encoder (media.py) takes images for texts."""

    def __new__(cls, model: Settings | str | os.PathLike | None = None, **options: Any) -> Encoder:
        media = MEDIA_ENCODERS.get("image") if cls is Encoder and reads_media(model) else None
        return media(model, **options) if media is not None else super().__new__(cls)

    def __init__(self, model: Settings | str | os.PathLike | None = None, **options: Any) -> None:
        given = settings_of(model, options)  # checks every value before anything loads
        loaded = load(given)  # the model, its tokenizer and engine (loading.py)
        self.settings, self.source, self.name = loaded.settings, loaded.source, loaded.name
        self._config, self.tokenizer, self.models = loaded.config, loaded.tokenizer, loaded.models
        self.inputs, self.engine, self.is_decoder = loaded.inputs, loaded.engine, loaded.is_decoder
        self.sentence_transformers = loaded.sentence_transformers
        self.model_type, self.n_layers = str(loaded.config.model_type), int(loaded.config.num_hidden_layers)
        self.hidden_size = int(loaded.config.hidden_size)
        if self.device.type == "cuda":  # the GPU's set-up paid here, not by the first call (warm.py)
            warm_device(self.engine, self.tokenizer.unk_token_id or 0, self.n_hidden_states)

    @classmethod
    def from_settings(cls, settings: Settings) -> Encoder:
        """The Encoder ``settings`` describe (every field of it, none dropped): ``Encoder(settings)``."""
        return cls(as_settings(settings))

    # what runs, read from the engine's resolved Settings (the Encoder keeps no copy of a field)
    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def model_dtype(self) -> ModelDtype:
        return self.settings.model_dtype

    @property
    def method(self) -> Method:  # the default of calls that do not say
        return self.settings.method

    @property
    def final_norm(self) -> FinalNorm:  # the default of calls that do not say
        return self.settings.final_norm

    @property
    def max_length(self) -> int:
        return self.engine.max_length

    @property
    def batch_size(self) -> int:  # the default of every call
        return self.engine.batch_size

    @property
    def max_tokens(self) -> int:  # the default of every call
        return self.engine.max_tokens

    @property
    def config(self) -> Any:  # transformers' own config class (one read plainly at load: on first use)
        self._config = transformers_config(self._config, self.source)
        return self._config

    @property
    def model(self):  # the transformers model, built on first use (the packed forward needs none)
        return self.models.transformers()

    @property
    def streamed(self) -> bool:  # layer by layer: streaming=True, or None and too large to hold
        return bool(self.engine.settings.streaming)

    @property
    def run_path(self) -> str:  # "packed", "streamed" or "general" (transformers' own forward)
        return self.engine.path

    @property
    def n_hidden_states(self) -> int:  # the embedding output plus one per layer
        return self.n_layers + 1

    def __repr__(self) -> str:
        return (
            f"Encoder({self.name!r}, n_layers={self.n_layers}, hidden_size={self.hidden_size}, "
            f"device='{self.device}', model_dtype='{self.model_dtype}')"
        )

    def settle(self, plan: OutputPlan) -> OutputPlan:
        """``plan`` with this model's answer to what it leaves open (its final norm: this
        Encoder's default), checked against this model (layers in range, a final norm it can
        honour): the plan a run carries out and its outputs record."""
        plan.hidden_states(self.n_hidden_states)  # a layer past the model fails here
        return settled_plan(self, plan)

    def run_settings(self) -> dict:
        """These settings as a record says them: ``final_norm`` is None for a model without one."""
        return run_settings(self)

    def run_meta(self, plan: OutputPlan) -> dict:
        """How a run of ``plan`` is made, for every output's metadata (records.py)."""
        return run_meta(self, self.settle(plan))

    def iter_results(
        self,
        plan: OutputPlan,
        texts: Sequence[str] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        words: Sequence[Sequence[str]] | None = None,
        progress: bool | None = None,
        report_truncation: bool = True,
    ) -> Iterator[tuple[int, LayerStack, Result]]:
        """The one path from a plan to its outputs: ``(input index, LayerStack, result)`` as batches
        finish. The forward computes the plan's hidden states (its long texts, stride and final
        norm), and the plan makes each stack its result (a LayerStack, WordVectors or
        SentenceVector). Every writer, ``embed``, ``embed_words``, Ray and the server read it. For a
        sentence or word plan the vectors are pooled, fused and normalised on the model's device: its
        stacks then carry them (``pooled``) and every token's metadata, but no token states."""
        settled = self.settle(plan)
        call = plan_call(self, settled)
        raw = normalize_inputs(texts, text_pairs=text_pairs, pairs=pairs, words=words)
        stream = stream_stacks(self, call, raw, progress, report_truncation)
        return ((index, stack, settled.result(stack, self.n_hidden_states)) for index, stack in stream)

    def iter_batches(
        self,
        plan: OutputPlan,
        texts: Sequence[str] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        words: Sequence[Sequence[str]] | None = None,
        progress: bool | None = None,
    ) -> tuple[Iterator[tuple[EncodedBlock, Any, Any]] | None, tuple[int, ...]]:
        """A sentence or word plan's results batch by batch, ``(block, rows, Rows)``, where the engine
        runs it blockwise (the packed forward, no windows), with the hidden states they hold; else
        ``(None, ...)``: take :meth:`iter_results`. The options are checked, and the first block
        tokenised, before this returns."""
        settled = self.settle(plan)
        call = plan_call(self, settled)
        if call.device_pool is None or not self.engine.blockwise(call):
            return None, call.layers
        raw = normalize_inputs(texts, text_pairs=text_pairs, pairs=pairs, words=words)
        return stream_batches(self, call, raw, progress), call.layers

    def tokenize(
        self,
        texts: Sequence[str] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        words: Sequence[Sequence[str]] | None = None,
    ) -> list[EncodedInput]:
        """Tokenise without running the model: ids, tokens, offsets, word ids, truncation flags."""
        return self.inputs.encode(normalize_inputs(texts, text_pairs=text_pairs, pairs=pairs, words=words))

    def iter_extract(
        self,
        texts: Sequence[str] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        words: Sequence[Sequence[str]] | None = None,
        layers: LayerSpec = "all",
        method: Method | None = None,
        taps: Sequence[str] = (),
        long_texts: LongTexts = "truncate",
        stride: int | None = None,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        progress: bool | None = None,
        report_truncation: bool = True,
        final_norm: FinalNorm | None = None,
        dtype: str = "float32",
    ) -> Iterator[tuple[int, LayerStack]]:
        """Yield ``(input index, LayerStack)`` as batches finish (longest inputs first).

        Memory stays bounded by one block of inputs; use :meth:`extract` for results in input order.
        Arguments are checked, and the first block of inputs tokenised, before this returns, so bad
        options fail here; a later block's bad input fails at its turn, after the results of the
        inputs before it (calls.py). Callers that run a corpus in blocks pass
        ``report_truncation=False`` and report once themselves.
        ``method`` and ``final_norm``: None takes the Encoder's own. ``dtype``: of the states
        (float32, or float16: cast on the device, so half the bytes cross and no float32 is made)."""
        call = make_call(
            self, layers, method, taps, long_texts, stride, batch_size, max_tokens, final_norm, dtype
        )
        raw = normalize_inputs(texts, text_pairs=text_pairs, pairs=pairs, words=words)
        return stream_stacks(self, call, raw, progress, report_truncation)

    @overload
    def extract(self, texts: str, **options: object) -> LayerStack: ...  # type: ignore[overload-overlap]
    @overload
    def extract(self, texts: Sequence[str] | None = None, **options: object) -> list[LayerStack]: ...

    def extract(
        self,
        texts=None,
        *,
        text_pairs=None,
        pairs=None,
        words=None,
        layers="all",
        method=None,
        taps=(),
        long_texts="truncate",
        stride=None,
        batch_size=None,
        max_tokens=None,
        progress=None,
        final_norm=None,
        dtype="float32",
    ):
        """Hidden states of every requested layer, one :class:`LayerStack` per input, in input order.
        Pass ``texts`` (optionally with ``text_pairs``), ``pairs`` or pre-split ``words``; the
        keywords are those of :meth:`iter_extract`. A single string gives a single LayerStack.
        ``layers`` takes any layer spec ("all", -1, [0, 4, -1], "0:4", "last4"); ``method`` picks
        ``output_hidden_states`` or forward hooks (same numbers); ``taps`` adds sub-layer outputs:
        attention_probs, attention_output, intermediate; ``final_norm`` (decoders): the final norm
        on the last hidden state (True), none (False) or every one ("all"); None: the Encoder's;
        ``dtype``: float32 (default) or float16 states."""
        single = self.one_input(texts)
        if single:
            if text_pairs is not None:
                raise InputError("with a single text, pass a list: extract([text], text_pairs=[second])")
            texts = [texts]
        stream = self.iter_extract(
            texts,
            text_pairs=text_pairs,
            pairs=pairs,
            words=words,
            layers=layers,
            method=method,
            taps=taps,
            long_texts=long_texts,
            stride=stride,
            batch_size=batch_size,
            max_tokens=max_tokens,
            progress=progress,
            final_norm=final_norm,
            dtype=dtype,
        )
        results = dict(stream)
        ordered = [results[i] for i in range(len(results))]
        return ordered[0] if single else ordered


# what Encoder(model) makes of a model that reads images, told from its config.json before anything
# loads: media.py's MediaEncoder, registered by the package (__init__.py) as an Encoder
MEDIA_ENCODERS: dict[str, Callable[..., Encoder]] = {}
