"""Encoder: a model and its fast tokenizer, ready to extract every layer.

    enc = Encoder()                        # the packaged all-MiniLM-L6-v2, offline
    enc = Encoder("bert-base-uncased")     # a Hugging Face name (from the local cache when offline)
    enc = Encoder("path/to/folder")        # a folder with config.json, weights and tokenizer files
    enc = Encoder("SmolLM2.Q4_1.gguf")     # a decoder LM (Llama, Qwen2, Mistral, Gemma, GPT-2), GGUF too
    stacks = enc.extract(["The bank raised rates."], layers="all")

The data flows one way: inputs (inputs.py) -> the engine (extract.py: batches, forward, windows)
-> LayerStacks (results.py) -> an OutputPlan (plan.py) or the feature functions (features.py).
The Encoder holds the model and exposes the short public calls; it does no pooling itself.
Batching follows sentence-transformers' ``encode``: inputs sorted by token length, batched, run
under ``torch.inference_mode``, moved to the CPU batch by batch, and returned in input order.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any, Literal, overload

import numpy as np
import torch

from .errors import InputError, OptionError, check_choice
from .extract import METHODS, Engine, Method
from .features.layers import LayerSpec, resolve_layers
from .features.plan import OutputPlan
from .features.pool import SentencePool, SpecialTokens, SubwordPool
from .features.stream import all_features, features_layers, sentence_matrix, word_vectors
from .inputs.encoding import (
    EncodedInput,
    InputEncoder,
    as_texts,
    normalize_inputs,
    report_empty_words,
    report_truncation_warning,
    split_word_inputs,
)
from .inputs.windows import check_window_memory, check_window_options
from .model.decoders import is_decoder_config
from .model.gguf_files import gguf_read_once
from .model.handle import ModelHandle
from .model.hooks import check_taps
from .model.source import (
    load_config_and_tokenizer,
    pick_device,
    read_sentence_transformers,
    resolve_model_source,
    sentence_convention,
    usable_max_length,
)
from .results import LayerStack, WordVectors

logger = logging.getLogger("layerwise")

ModelDtype = Literal["float32", "float16", "bfloat16"]
MODEL_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
LongTexts = Literal["truncate", "window"]
LONG_TEXTS: tuple[str, ...] = ("truncate", "window")
CPU_MAX_TOKENS = 2048
GPU_MAX_TOKENS = 32768
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _positive(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(
            f"{name}={value!r} must be a whole number >= 1" + (" (or None)" if optional else "")
        )


class Encoder:
    """A BERT-family encoder or a decoder language model that returns every hidden state.

    Args:
        model: a hub name, a folder, a GGUF file, or None for the packaged all-MiniLM-L6-v2.
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:1"``…
        model_dtype: the model's weights and compute dtype; results are always float32.
        max_length: tokens per input with special tokens; default: the model's (ST max_seq_length)
        batch_size: at most this many inputs per forward pass.
        max_tokens: tokens per forward pass (real ones when packed, else inputs x longest input);
            2048 on CPU (benchmarks/token_budget.py), 32768 on GPU.
        packed: the unpadded forward (packed.py) where the architecture allows it; False, taps or
            ``method="hooks"``: the Hugging Face padded forward (the same numbers).
        streams: packed batches run at once on the CPU, each on its share of torch's threads
            (streams.py); default 2 for a model up to 512 wide on 2+ threads, else 1.
        allow_nan: keep NaN/inf hidden states (with a warning); else a NonFiniteError names the input.
        final_norm: a decoder's last hidden state after its final norm (True), before it, or "all" after it.
    Front ends batching across callers use ``inputs.encode`` and ``engine.stream`` directly."""

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        *,
        device: str | torch.device = "auto",
        model_dtype: ModelDtype = "float32",
        max_length: int | None = None,
        batch_size: int = 128,
        max_tokens: int | None = None,
        packed: bool = True,
        streams: int | None = None,
        allow_nan: bool = False,
        final_norm: bool | Literal["all"] = True,
    ) -> None:
        check_choice("model_dtype", model_dtype, MODEL_DTYPES)
        check_choice("final_norm", final_norm, (True, False, "all"))  # type: ignore[arg-type]
        _positive("batch_size", batch_size, optional=False)
        _positive("max_tokens", max_tokens, optional=True)
        self.source, self.name = resolve_model_source(model)
        self.device = pick_device(device)
        self.model_dtype: ModelDtype = model_dtype
        dtype = _TORCH_DTYPES[model_dtype]  # light=packed: the packed forward needs no transformers class
        with gguf_read_once(self.source):
            self.config, self.tokenizer = load_config_and_tokenizer(self.source, self.name)  # fast tokenizer
            self.models = ModelHandle(self.source, self.name, self.config, dtype, self.device, light=packed)
        self.model_type, self.n_layers, self.hidden_size = _dimensions(self.config)
        self.is_decoder, self.final_norm = _decoder_and_final_norm(self.config, final_norm, self.name)
        self.sentence_transformers = read_sentence_transformers(self.source)
        convention = self.sentence_transformers.max_seq_length if self.sentence_transformers else None
        padding_idx = _padding_idx(self.models.current)
        self.max_length = usable_max_length(self.config, self.tokenizer, max_length, convention, padding_idx)
        vocab = int(self.config.vocab_size)  # token ids past it are refused at encode time
        self.inputs = InputEncoder(self.tokenizer.backend_tokenizer, self.max_length, vocab_size=vocab,
                                   pairs=not self.is_decoder)  # fmt: skip
        max_tokens = max_tokens or (CPU_MAX_TOKENS if self.device.type == "cpu" else GPU_MAX_TOKENS)
        self.engine = Engine(self.models, self.tokenizer, device=self.device, max_length=self.max_length,
                             batch_size=batch_size, max_tokens=max_tokens, packed=packed,
                             streams=streams, allow_nan=allow_nan, final_norm=final_norm)  # fmt: skip
        self.batch_size, self.max_tokens = batch_size, max_tokens  # the defaults of every call

    @property
    def model(self):  # the transformers model, built on first use (the packed forward needs none)
        return self.models.transformers()

    @property
    def n_hidden_states(self) -> int:  # the embedding output plus one per layer
        return self.n_layers + 1

    def __repr__(self) -> str:
        return (f"Encoder({self.name!r}, n_layers={self.n_layers}, hidden_size={self.hidden_size}, "
                f"device='{self.device}', model_dtype='{self.model_dtype}')")  # fmt: skip

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
        method: Method = "hidden_states",
        taps: Sequence[str] = (),
        long_texts: LongTexts = "truncate",
        stride: int | None = None,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        progress: bool | None = None,
        report_truncation: bool = True,
    ) -> Iterator[tuple[int, LayerStack]]:
        """Yield ``(input index, LayerStack)`` as batches finish (longest inputs first).

        Memory stays bounded by one batch; use :meth:`extract` for results in input order. Arguments
        are checked and inputs tokenised before this returns, so bad input fails here. Callers that
        run a corpus in blocks pass ``report_truncation=False`` and report once themselves."""
        layer_ids = resolve_layers(layers, self.n_hidden_states)
        taps = _check_extract_options(self, method, taps, long_texts, stride)
        raw = normalize_inputs(texts, text_pairs=text_pairs, pairs=pairs, words=words)
        if long_texts == "window":
            check_window_memory(raw, len(layer_ids), self.hidden_size)
        encoded = self.inputs.encode(raw, truncate=long_texts == "truncate")
        if report_truncation:
            report_truncation_warning(encoded, self.max_length)
        report_empty_words(encoded)
        return self.engine.stream(
            encoded, layers=layer_ids, method=method, taps=taps, stride=stride, batch_size=batch_size,
            max_tokens=max_tokens, progress=progress,
        )  # fmt: skip

    @overload
    def extract(self, texts: str, **options: object) -> LayerStack: ...  # type: ignore[overload-overlap]
    @overload
    def extract(self, texts: Sequence[str] | None = None, **options: object) -> list[LayerStack]: ...

    def extract(self, texts=None, *, text_pairs=None, pairs=None, words=None, layers="all",
                method="hidden_states", taps=(), long_texts="truncate", stride=None, batch_size=None,
                max_tokens=None, progress=None):  # fmt: skip
        """Hidden states of every requested layer, one :class:`LayerStack` per input, in input order.
        Pass ``texts`` (optionally with ``text_pairs``), ``pairs`` or pre-split ``words``; the
        keywords are those of :meth:`iter_extract`. A single string gives a single LayerStack.
        ``layers`` takes any layer spec ("all", -1, [0, 4, -1], "0:4", "last4"); ``method`` picks
        ``output_hidden_states`` or forward hooks (same numbers); ``taps`` adds sub-layer outputs:
        attention_probs, attention_output, intermediate."""
        single = isinstance(texts, str)
        if single:
            if text_pairs is not None:
                raise InputError("with a single text, pass a list: extract([text], text_pairs=[second])")
            texts = [texts]
        stream = self.iter_extract(
            texts, text_pairs=text_pairs, pairs=pairs, words=words, layers=layers, method=method,
            taps=taps, long_texts=long_texts, stride=stride, batch_size=batch_size, max_tokens=max_tokens,
            progress=progress,
        )  # fmt: skip
        results = dict(stream)
        ordered = [results[i] for i in range(len(results))]
        return ordered[0] if single else ordered

    # ------------------------------------------------------------------ features
    def embed(
        self,
        texts: str | Sequence[str] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        layers: LayerSpec | None = None,
        pool: SentencePool = "mean",
        fuse: str | None = None,
        special_tokens: SpecialTokens = "include",
        normalize: bool = False,
        long_texts: LongTexts = "truncate",
        stride: int | None = None,
        progress: bool | None = None,
    ) -> np.ndarray:
        """Sentence vectors: ``(n_texts, n_layers, hidden)``; ``(n_texts, hidden)`` for one int layer
        or float depth (it drops the axis, as in NumPy); ``(n_texts, dim)`` with ``fuse``.

        ``pool``: cls, mean, max or last (a decoder's convention); ``special_tokens``: include
        (default, as sentence-transformers) or exclude [CLS]/[SEP]. ``fuse``: a named fusion (last,
        concat_last4, mean_all, …) or mean/sum/concat over ``layers``. ``normalize``: L2-normalise
        each vector. A single string gives a single row."""
        plan = OutputPlan(layers, "sentence", pool, special_tokens, fuse, normalize=normalize)
        single = isinstance(texts, str)
        batch = [texts] if single else (as_texts(texts) if texts is not None else None)  # any iterable
        stream = self.iter_extract(
            batch, text_pairs=text_pairs, pairs=pairs, layers=plan.hidden_states(self.n_hidden_states),  # type: ignore[arg-type]
            long_texts=long_texts, stride=stride, progress=progress,
        )  # fmt: skip
        n_texts = len(batch) if batch is not None else len(pairs or ())
        array = sentence_matrix(
            stream, n_texts, plan, n_hidden_states=self.n_hidden_states, hidden_size=self.hidden_size
        )
        if _drops_axis(layers, fuse):
            array = array[:, 0]
        return array[0] if single else array

    def encode(self, texts: str | Sequence[str], *, progress: bool | None = None) -> np.ndarray:
        """sentence-transformers' ``encode()``: the last layer, pooled and normalised as modules.json
        says, truncated at max_seq_length (else mean pooling, no normalisation)."""
        pool, normalize = sentence_convention(self.sentence_transformers)
        return self.embed(texts, layers=-1, pool=pool, normalize=normalize, progress=progress)  # type: ignore[arg-type]

    def embed_words(
        self,
        inputs: Sequence[str] | Sequence[Sequence[str]] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        words: Sequence[Sequence[str]] | None = None,
        subword: SubwordPool = "first",
        layers: LayerSpec | None = None,
        fuse: str | None = None,
        long_texts: LongTexts = "truncate",
        stride: int | None = None,
        progress: bool | None = None,
    ) -> list[WordVectors]:
        """Word vectors per input: ``WordVectors.vectors`` is ``(n_layers, n_words, dim)``,
        ``(n_words, dim)`` for one int layer or with ``fuse``. ``inputs``: raw texts (words found by
        the tokenizer's pre-tokenizer and character offsets) or pre-split word lists (aligned to your
        words); or pass ``words=`` / ``texts`` with ``text_pairs=`` as in :meth:`extract`.
        ``subword``: first (default, as in the BERT paper), last, mean, first_last or max."""
        plan = OutputPlan(layers, "word", subword, fuse=fuse)
        texts, words = split_word_inputs(inputs, words)
        stream = self.iter_extract(
            texts, text_pairs=text_pairs, pairs=pairs, words=words,
            layers=plan.hidden_states(self.n_hidden_states), long_texts=long_texts, stride=stride,
            progress=progress,
        )  # fmt: skip
        n_inputs = len(next(x for x in (texts, pairs, words) if x is not None) or ())
        results = word_vectors(stream, n_inputs, plan, n_hidden_states=self.n_hidden_states)
        if _drops_axis(layers, fuse):
            results = [WordVectors(**{**r.__dict__, "vectors": r.vectors[0]}) for r in results]
        return results

    def features(
        self,
        texts: Sequence[str] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        pools: Sequence[SentencePool] = ("mean",),
        fuses: Sequence[str] = ("last",),
        layers: LayerSpec | None = None,
        special_tokens: SpecialTokens = "include",
        long_texts: LongTexts = "truncate",
        stride: int | None = None,
        progress: bool | None = None,
    ) -> dict[tuple[str, str], np.ndarray]:
        """Every (pool, fusion) from ONE forward pass: ``{(pool, fuse): (n_texts, dim)}``."""
        texts = as_texts(texts) if texts is not None else None  # any iterable; a str is refused
        pools, fuses = list(pools), list(fuses)
        extracted = features_layers(fuses, layers, pools, special_tokens, self.n_hidden_states)
        stream = self.iter_extract(
            texts, text_pairs=text_pairs, pairs=pairs, layers=extracted, long_texts=long_texts, stride=stride,
            progress=progress,
        )  # fmt: skip
        n_texts = len(texts) if texts is not None else len(pairs or ())
        results = all_features(
            stream, n_texts, pools=pools, fuses=fuses, layers=layers, extracted=extracted,
            special_tokens=special_tokens, n_hidden_states=self.n_hidden_states, hidden_size=self.hidden_size,
        )  # fmt: skip
        return {(p, f): results[(p, f)] for p in pools for f in fuses}


def _decoder_and_final_norm(config: Any, final_norm: Any, name: str) -> tuple[bool, Any]:
    """Whether the model is a decoder LM, and its ``final_norm`` setting (``"all"`` needs a decoder)."""
    is_decoder = is_decoder_config(config)
    if final_norm == "all" and not is_decoder:
        raise OptionError(
            f"final_norm='all' passes every hidden state through a decoder's final norm; {name!r} is an "
            "encoder, which has none: leave final_norm out"
        )
    return is_decoder, final_norm


def _dimensions(config) -> tuple[str, int, int]:
    """``(model_type, n_layers, hidden_size)`` of a config."""
    return str(config.model_type), int(config.num_hidden_layers), int(config.hidden_size)


def _padding_idx(model: object) -> int | None:
    """The embeddings' own padding index (MPNet fixes it at 1); decoders have none to say."""
    return getattr(getattr(model, "embeddings", None), "padding_idx", None)


def _check_extract_options(
    encoder: Encoder, method: str, taps: Sequence[str], long_texts: str, stride: int | None
) -> tuple[str, ...]:
    """The options of a call that extracts, checked before any work; the taps as a tuple."""
    check_choice("method", method, METHODS)
    checked = check_taps(taps)
    if encoder.is_decoder and set(checked) - {"attention_probs"}:
        raise OptionError(
            f"taps={list(checked)!r}: a decoder LM ({encoder.model_type}) has the attention_probs tap only; "
            "its blocks are pre-norm, with no module for attention_output or intermediate"
        )
    check_choice("long_texts", long_texts, LONG_TEXTS)
    check_window_options(long_texts, stride, encoder.max_length)
    return checked


def _drops_axis(layers: LayerSpec | None, fuse: str | None) -> bool:
    """An int layer index (or a float depth, one layer too) drops the layer axis, as in NumPy; a
    list, range or string keeps it."""
    return fuse is None and isinstance(layers, int | float) and not isinstance(layers, bool)
