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
from collections.abc import Iterator, Sequence
from typing import Any, overload

import torch

from .._engine.call import Call
from .._engine.engine import Engine
from .._features.device_pool import DevicePlan
from .._features.layers import LayerSpec
from .._features.names import LongTexts
from .._features.plan import OutputPlan, Result, check_final_norm_for
from .._host.memory import available_memory
from .._inputs.encoding import EncodedBlock, EncodedInput, InputEncoder, normalize_inputs
from .._model.decoders import is_decoder_config
from .._model.forward.concurrent import check_streams
from .._model.handle import ModelHandle
from .._model.loading.gguf_files import gguf_read_once
from .._model.loading.placement import placement_of
from .._model.loading.sentence_transformers import read_sentence_transformers
from .._model.loading.source import (
    load_config_and_tokenizer,
    pick_device,
    resolve_model_source,
    usable_max_length,
)
from .._model.streaming.fits import resolve_streaming
from .._model.streaming.plan import plan_stream
from .._results import LayerStack
from .._settings.settings import FinalNorm, Method, ModelDtype, Settings, settings_of
from ..errors import InputError, OptionError
from .calls import make_call, stream_batches, stream_stacks
from .features import FeatureCalls
from .records import RunRecords
from .warm import warm_device

logger = logging.getLogger("layerwise")

CPU_MAX_TOKENS = 2048
GPU_MAX_TOKENS = 32768
# inputs per batch: on a GPU 128 short sentences (~3,500 tokens) leave an H100 idle; 1024 with the
# token budget ran embed 1.4x and extract 1.5x faster on one (benchmarks/gpu_profile.py)
CPU_BATCH_SIZE, GPU_BATCH_SIZE = 128, 1024
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class Encoder(FeatureCalls, RunRecords):
    """A BERT-family encoder or a decoder language model that returns every hidden state.

    ``Encoder(settings)``: a :class:`~layerwise.Settings`, the one value that says which model and
    how it runs. ``Encoder(model, **options)`` is the short form: ``model`` a hub name, a folder, a
    GGUF file, or None for the packaged all-MiniLM-L6-v2, and the options the other fields of
    Settings, which documents each (device, model_dtype, max_length, batch_size, max_tokens,
    packed, streams, allow_nan, final_norm, method). ``enc.settings`` says what it was made with,
    ``enc.engine.settings`` the same resolved for this model and device (what runs).
    Front ends batching across callers use ``inputs.encode`` and ``engine.run_inputs`` directly."""

    def __init__(self, model: Settings | str | os.PathLike | None = None, **options: Any) -> None:
        given = settings_of(model, options)  # checks every value before anything loads
        self.source, self.name = resolve_model_source(given.model)
        device = pick_device(given.device)
        dtype = _TORCH_DTYPES[given.model_dtype]  # light=packed: the packed forward needs no HF class
        with gguf_read_once(self.source):
            self.config, self.tokenizer = load_config_and_tokenizer(self.source, self.name)  # fast tokenizer
            # streaming=None: streamed when the weights do not fit in the device's free memory
            streaming = resolve_streaming(given, self.source, self.config, dtype, device, self.name)
            placement = placement_of(given, self.config, device, dtype)  # a device map, quantised weights
            self.models = ModelHandle(self.source, self.name, self.config, dtype, device, light=given.packed,
                                      streaming=streaming, placement=placement)  # fmt: skip
        device = self.models.device  # a placed model's: where its inputs go
        self.model_type, self.n_layers, self.hidden_size = _dimensions(self.config)
        self.is_decoder = _checked_decoder(self.config, given.final_norm, self.name)
        self.sentence_transformers = read_sentence_transformers(self.source)
        convention = self.sentence_transformers.max_seq_length if self.sentence_transformers else None
        max_length = usable_max_length(
            self.config, self.tokenizer, given.max_length, convention, _padding_idx(self.models.current)
        )
        vocab = int(self.config.vocab_size)  # token ids past it are refused at encode time
        self.inputs = InputEncoder(self.tokenizer.backend_tokenizer, max_length, vocab_size=vocab,
                                   pairs=not self.is_decoder)  # fmt: skip
        # what it was made with; the model by its name (the packaged default's hub name for None),
        # which any process resolves to the same files (Encoder.source is where they were found)
        self.settings = given.replace(model=self.name)  # streaming: as given (None: decided by size)
        on_cpu = device.type == "cpu"
        max_tokens = given.max_tokens or (CPU_MAX_TOKENS if on_cpu else GPU_MAX_TOKENS)
        streams = check_streams(given.streams, device, self.hidden_size)  # batches running at once
        plan = None
        if self.models.streamed is not None:  # how its blocks run: settled before its forward is built
            plan = plan_stream(given, self.models.streamed.shape(), on_cuda=device.type == "cuda",
                               host_free=available_memory(), max_length=max_length,
                               max_tokens=max_tokens, streams=streams)  # fmt: skip
        resolved = self.settings.replace(
            device=str(device),
            max_length=max_length,
            batch_size=given.batch_size or (CPU_BATCH_SIZE if on_cpu else GPU_BATCH_SIZE),
            max_tokens=max_tokens if plan is None else plan.batch_tokens,
            streams=given.streams if plan is None else plan.streams,  # a tight budget: one at a time
            packed=given.packed and placement is None,  # accelerate's hooks run in transformers' forward
            stream_block_tokens=None if plan is None else plan.block_tokens,
            streaming=streaming,
        )
        self.engine = Engine(self.models, self.tokenizer, resolved, plan)
        if device.type == "cuda":  # the GPU's set-up paid here, not by the first call (warm.py)
            warm_device(self.engine, self.tokenizer.unk_token_id or 0, self.n_hidden_states)

    @classmethod
    def from_settings(cls, settings: Settings) -> Encoder:
        """The Encoder ``settings`` describe (every field of it, none dropped): ``Encoder(settings)``."""
        if not isinstance(settings, Settings):
            raise OptionError(f"settings must be a layerwise.Settings, not {type(settings).__name__}")
        return cls(settings)

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
    def model(self):  # the transformers model, built on first use (the packed forward needs none)
        return self.models.transformers()

    @property
    def streamed(self) -> bool:  # layer by layer: streaming=True, or None and too large to hold
        return bool(self.engine.settings.streaming)

    @property
    def n_hidden_states(self) -> int:  # the embedding output plus one per layer
        return self.n_layers + 1

    def __repr__(self) -> str:
        return (f"Encoder({self.name!r}, n_layers={self.n_layers}, hidden_size={self.hidden_size}, "
                f"device='{self.device}', model_dtype='{self.model_dtype}')")  # fmt: skip

    def settle(self, plan: OutputPlan) -> OutputPlan:
        """``plan`` with this model's answer to what it leaves open (its final norm: this
        Encoder's default), checked against this model (layers in range, no final norm on an
        encoder): the plan a run carries out and its outputs record."""
        plan.hidden_states(self.n_hidden_states)  # a layer past the model fails here
        return plan.with_final_norm(self.final_norm, is_decoder=self.is_decoder)

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
        call = self.plan_call(settled)
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
        call = self.plan_call(settled)
        if call.device_pool is None or not self.engine.blockwise(call):
            return None, call.layers
        raw = normalize_inputs(texts, text_pairs=text_pairs, pairs=pairs, words=words)
        return stream_batches(self, call, raw, progress), call.layers

    def plan_call(self, settled: OutputPlan) -> Call:
        """The engine's call for a settled plan: its hidden states, long texts and final norm; a
        sentence or word plan is pooled, fused and normalised on the model's device
        (_features/device_pool.py): only its results cross to the host, and the stacks carry them
        (``pooled``), no token states."""
        on_device = None
        if settled.level in ("sentence", "word") and settled.mode is not None:
            on_device = DevicePlan(settled.level, settled.mode, settled.special_tokens, settled.fuse,
                                   settled.normalize, self.n_hidden_states)  # fmt: skip
        layers = settled.hidden_states(self.n_hidden_states)
        return make_call(self, layers, long_texts=settled.long_texts, stride=settled.stride,
                         final_norm=settled.final_norm, device_pool=on_device)  # fmt: skip

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

    def extract(self, texts=None, *, text_pairs=None, pairs=None, words=None, layers="all",
                method=None, taps=(), long_texts="truncate", stride=None, batch_size=None,
                max_tokens=None, progress=None, final_norm=None, dtype="float32"):  # fmt: skip
        """Hidden states of every requested layer, one :class:`LayerStack` per input, in input order.
        Pass ``texts`` (optionally with ``text_pairs``), ``pairs`` or pre-split ``words``; the
        keywords are those of :meth:`iter_extract`. A single string gives a single LayerStack.
        ``layers`` takes any layer spec ("all", -1, [0, 4, -1], "0:4", "last4"); ``method`` picks
        ``output_hidden_states`` or forward hooks (same numbers); ``taps`` adds sub-layer outputs:
        attention_probs, attention_output, intermediate; ``final_norm`` (decoders): the final norm
        on the last hidden state (True), none (False) or every one ("all"); None: the Encoder's;
        ``dtype``: float32 (default) or float16 states."""
        single = isinstance(texts, str)
        if single:
            if text_pairs is not None:
                raise InputError("with a single text, pass a list: extract([text], text_pairs=[second])")
            texts = [texts]
        stream = self.iter_extract(
            texts, text_pairs=text_pairs, pairs=pairs, words=words, layers=layers, method=method,
            taps=taps, long_texts=long_texts, stride=stride, batch_size=batch_size, max_tokens=max_tokens,
            progress=progress, final_norm=final_norm, dtype=dtype,
        )  # fmt: skip
        results = dict(stream)
        ordered = [results[i] for i in range(len(results))]
        return ordered[0] if single else ordered


def _checked_decoder(config: Any, final_norm: Any, name: str) -> bool:
    """Whether the model is a decoder LM (its ``final_norm`` setting checked: ``"all"`` needs one)."""
    is_decoder = is_decoder_config(config)
    check_final_norm_for(final_norm, is_decoder=is_decoder, name=repr(name))
    return is_decoder


def _dimensions(config) -> tuple[str, int, int]:
    """``(model_type, n_layers, hidden_size)`` of a config."""
    return str(config.model_type), int(config.num_hidden_layers), int(config.hidden_size)


def _padding_idx(model: object) -> int | None:
    """The embeddings' own padding index (MPNet fixes it at 1); decoders have none to say."""
    return getattr(getattr(model, "embeddings", None), "padding_idx", None)
