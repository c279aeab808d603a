"""Encoder: a BERT-family model and its fast tokenizer, ready to extract every layer.

    enc = Encoder()                        # the packaged all-MiniLM-L6-v2, offline
    enc = Encoder("bert-base-uncased")     # a Hugging Face name (from the local cache when offline)
    enc = Encoder("path/to/folder")        # a folder with config.json, weights and tokenizer files
    stacks = enc.extract(["The bank raised rates."], layers="all")

Batching follows sentence-transformers' ``encode``: inputs are sorted by token length, batched,
run under ``torch.inference_mode``, moved to the CPU batch by batch, and returned in input order.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Literal, overload

import numpy as np
import torch

from .errors import InputError, ModelLoadError, OptionError, check_choice
from .extract import METHODS, Method, collate, forward_batch, make_stack, split_rows
from .hooks import TAPS, find_layer_list
from .inputs import EncodedInput, InputEncoder, length_sorted_batches, normalize_inputs
from .layers import LayerSpec, resolve_layers
from .model_source import load_model, pick_device, resolve_model_source, usable_max_length
from .pool import SentencePool, SpecialTokens, SubwordPool
from .progress import progress_bar
from .results import LayerStack, WordVectors
from .windows import Window, check_window_options, plan_windows, stitch

logger = logging.getLogger("layerwise")

Dtype = Literal["float32", "float16", "bfloat16"]
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
LongTexts = Literal["truncate", "window"]
LONG_TEXTS: tuple[str, ...] = ("truncate", "window")
CPU_MAX_TOKENS = 2048
WINDOW_MEMORY = 2 * 2**30  # bytes of hidden states one windowed input may hold (see _check_window_memory)
GPU_MAX_TOKENS = 32768
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class Encoder:
    """A BERT-family encoder that returns every hidden state.

    Args:
        model: a Hugging Face model name, a local folder, or None for the packaged default
            (``sentence-transformers/all-MiniLM-L6-v2``).
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:1"``…
        dtype: weights and compute dtype; results are always returned as float32.
        max_length: tokens per input including special tokens; defaults to the model's maximum.
            Longer inputs are truncated and flagged.
        batch_size: at most this many inputs per forward pass.
        max_tokens: at most this many padded tokens (inputs x longest input) per forward pass;
            defaults to 2048 on CPU, where small working sets stay in cache (see
            benchmarks/extract_speed.py), and 32768 on GPU.
    """

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        *,
        device: str | torch.device = "auto",
        dtype: Dtype = "float32",
        max_length: int | None = None,
        batch_size: int = 128,
        max_tokens: int | None = None,
    ) -> None:
        check_choice("dtype", dtype, DTYPES)
        if batch_size < 1:
            raise OptionError(f"batch_size={batch_size} must be >= 1")
        if max_tokens is not None and max_tokens < 1:
            raise OptionError(f"max_tokens={max_tokens} must be >= 1")
        source, self.name = resolve_model_source(model)
        self.source = source
        self.device = pick_device(device)
        self.dtype: Dtype = dtype
        self.batch_size = batch_size
        self.max_tokens = max_tokens or (CPU_MAX_TOKENS if self.device.type == "cpu" else GPU_MAX_TOKENS)
        self.tokenizer, self.model = load_model(source, self.name, _TORCH_DTYPES[dtype])
        if not getattr(self.tokenizer, "is_fast", False):
            raise ModelLoadError(
                f"model {self.name!r} has no fast (Rust) tokenizer; layerwise needs one for word "
                "ids and character offsets. Save a tokenizer.json next to the model."
            )
        self.model.to(self.device).eval()
        config = self.model.config
        self.model_type: str = config.model_type
        self.n_layers: int = config.num_hidden_layers
        self.hidden_size: int = config.hidden_size
        self._layer_owner, self._layer_attr, self._layer_list = find_layer_list(self.model, self.n_layers)
        self.max_length = usable_max_length(config, self.tokenizer, max_length)
        self._inputs = InputEncoder(self.tokenizer.backend_tokenizer, self.max_length)
        accepts_types = "token_type_ids" in inspect.signature(self.model.forward).parameters
        self._with_token_types = accepts_types and getattr(config, "type_vocab_size", 0) >= 2
        pad_id = self.tokenizer.pad_token_id
        self._pad_id = pad_id if pad_id is not None else (getattr(config, "pad_token_id", None) or 0)
        self._lock = threading.RLock()
        self._warm_up()

    def _warm_up(self) -> None:
        """One full-depth forward with ``output_hidden_states`` before any truncated one.

        transformers 5 installs its hidden-state capture hooks lazily, on the layers present at the
        first such call; if that call ran on a truncated encoder, later full runs would miss layers.
        This also checks that the model returns one hidden state per layer plus the embeddings."""
        ids = [self.tokenizer.cls_token_id or 0, self.tokenizer.sep_token_id or 0]
        batch = {"input_ids": torch.tensor([ids], device=self.device)}
        with self._lock, torch.inference_mode():
            states = self.model(**batch, output_hidden_states=True).hidden_states
        if len(states) != self.n_hidden_states:
            raise ModelLoadError(
                f"{self.name!r} returned {len(states)} hidden states, expected {self.n_hidden_states} "
                "(embeddings + one per layer); is it a BERT-family encoder?"
            )

    # ------------------------------------------------------------------ properties
    @property
    def n_hidden_states(self) -> int:
        """Number of hidden states: the embedding output plus one per layer."""
        return self.n_layers + 1

    def __repr__(self) -> str:
        return (
            f"Encoder({self.name!r}, layers={self.n_layers}, hidden_size={self.hidden_size}, "
            f"device='{self.device}', dtype='{self.dtype}')"
        )

    # ------------------------------------------------------------------ inputs
    def tokenize(
        self,
        texts: Sequence[str] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        words: Sequence[Sequence[str]] | None = None,
    ) -> list[EncodedInput]:
        """Tokenise without running the model: ids, tokens, offsets, word ids, truncation flags."""
        raw = normalize_inputs(texts, text_pairs=text_pairs, pairs=pairs, words=words)
        return self._inputs.encode(raw)

    # ------------------------------------------------------------------ extraction
    def iter_extract(
        self,
        texts: Sequence[str] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        words: Sequence[Sequence[str]] | None = None,
        layers: LayerSpec = "all",
        batch_size: int | None = None,
        max_tokens: int | None = None,
        method: Method = "hidden_states",
        taps: Sequence[str] = (),
        progress: bool | None = None,
        long_texts: LongTexts = "truncate",
        stride: int | None = None,
    ) -> Iterator[tuple[int, LayerStack]]:
        """Yield ``(input index, LayerStack)`` as batches finish (longest inputs first).

        Memory stays bounded by one batch; use :meth:`extract` for results in input order.
        Arguments are checked and inputs tokenised before this returns, so bad input fails here."""
        return self._stream(
            texts, text_pairs=text_pairs, pairs=pairs, words=words, layers=layers, batch_size=batch_size,
            max_tokens=max_tokens, method=method, taps=taps, progress=progress, long_texts=long_texts,
            stride=stride, report_truncation=True,
        )  # fmt: skip

    def _stream(
        self,
        texts: Sequence[str] | None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        words: Sequence[Sequence[str]] | None = None,
        layers: LayerSpec = "all",
        batch_size: int | None = None,
        max_tokens: int | None = None,
        method: Method = "hidden_states",
        taps: Sequence[str] = (),
        progress: bool | None = None,
        long_texts: LongTexts = "truncate",
        stride: int | None = None,
        report_truncation: bool,
    ) -> Iterator[tuple[int, LayerStack]]:
        """:meth:`iter_extract`; callers that run it block by block (the store writer) report
        truncation once for the whole corpus instead, with corpus-wide input numbers."""
        layer_ids = resolve_layers(layers, self.n_hidden_states)
        check_choice("method", method, METHODS)
        taps = tuple(taps)
        for tap in taps:
            check_choice("taps item", tap, TAPS)
        if len(set(taps)) != len(taps):
            raise OptionError(f"taps={taps!r} names a tap more than once")
        check_choice("long_texts", long_texts, LONG_TEXTS)
        check_window_options(long_texts, stride, self.max_length)
        raw = normalize_inputs(texts, text_pairs=text_pairs, pairs=pairs, words=words)
        if long_texts == "window":
            self._check_window_memory(raw, len(layer_ids))
        encoded = self._inputs.encode(raw, truncate=long_texts == "truncate")
        if report_truncation:
            self._report_truncation(encoded)
        units: list[EncodedInput | Window] = []
        owners: list[tuple[int, int]] = []  # per unit: (input index, window number or -1)
        n_windows: dict[int, int] = {}
        for item in encoded:
            if len(item) <= self.max_length:
                units.append(item)
                owners.append((item.index, -1))
                continue
            if "attention_probs" in taps:
                raise OptionError(
                    f"attention_probs cannot be stitched across windows (input {item.index} has "
                    f"{len(item)} tokens > {self.max_length}); use long_texts='truncate' for attention maps"
                )
            windows = plan_windows(item, self.max_length, stride)
            n_windows[item.index] = len(windows)
            for k, window in enumerate(windows):
                units.append(window)
                owners.append((item.index, k))
        batches = length_sorted_batches(
            [len(u) for u in units], batch_size or self.batch_size, max_tokens or self.max_tokens
        )
        return self._run(encoded, units, owners, n_windows, batches, layer_ids, method, taps, progress)

    @overload
    def extract(
        self,
        texts: str,
        *,
        layers: LayerSpec = ...,
        batch_size: int | None = ...,
        max_tokens: int | None = ...,
        method: Method = ...,
        taps: Sequence[str] = ...,
        progress: bool | None = ...,
        long_texts: LongTexts = ...,
        stride: int | None = ...,
    ) -> LayerStack: ...

    @overload
    def extract(
        self,
        texts: Sequence[str] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        words: Sequence[Sequence[str]] | None = None,
        layers: LayerSpec = ...,
        batch_size: int | None = ...,
        max_tokens: int | None = ...,
        method: Method = ...,
        taps: Sequence[str] = ...,
        progress: bool | None = ...,
        long_texts: LongTexts = ...,
        stride: int | None = ...,
    ) -> list[LayerStack]: ...

    def extract(
        self,
        texts: str | Sequence[str] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        words: Sequence[Sequence[str]] | None = None,
        layers: LayerSpec = "all",
        batch_size: int | None = None,
        max_tokens: int | None = None,
        method: Method = "hidden_states",
        taps: Sequence[str] = (),
        progress: bool | None = None,
        long_texts: LongTexts = "truncate",
        stride: int | None = None,
    ) -> LayerStack | list[LayerStack]:
        """Hidden states of every requested layer, one :class:`LayerStack` per input, in input order.

        Pass ``texts`` (optionally with ``text_pairs``), ``pairs`` or pre-split ``words``. A single
        string gives a single LayerStack. ``layers`` takes any layer spec ("all", -1, [0, 4, -1],
        "0:4", "last4"); ``method`` picks ``output_hidden_states`` or forward hooks (same numbers);
        ``taps`` adds sub-layer outputs: attention_probs, attention_output, intermediate."""
        single = isinstance(texts, str)
        if single:
            if text_pairs is not None:
                raise InputError("with a single text, pass a list: extract([text], text_pairs=[second])")
            texts = [texts]  # type: ignore[list-item]
        iterator = self.iter_extract(
            texts,  # type: ignore[arg-type]
            text_pairs=text_pairs,
            pairs=pairs,
            words=words,
            layers=layers,
            batch_size=batch_size,
            max_tokens=max_tokens,
            method=method,
            taps=taps,
            progress=progress,
            long_texts=long_texts,
            stride=stride,
        )
        results: dict[int, LayerStack] = dict(iterator)
        ordered = [results[i] for i in range(len(results))]
        return ordered[0] if single else ordered

    def _check_window_memory(self, raw, n_layers: int) -> None:
        """Window mode holds every hidden state of an input until its windows are stitched; refuse,
        before tokenising, an input that would need more than WINDOW_MEMORY bytes for that (counted
        at one token per 4 characters, a low estimate for English WordPiece)."""
        bytes_per_token = n_layers * self.hidden_size * 4
        max_chars = 4 * WINDOW_MEMORY // bytes_per_token
        for i, text in enumerate(raw.texts):
            size = len(text) + (len(raw.text_pairs[i]) if raw.text_pairs is not None else 0)
            if size > max_chars:
                gib = size // 4 * bytes_per_token / 2**30
                raise InputError(
                    f"input {i} has {size:,} characters: with long_texts='window' its {n_layers} hidden "
                    f"states would take about {gib:.1f} GiB until its windows are stitched; the limit "
                    f"for this model and these layers is {max_chars:,} characters per input. Split such "
                    "documents (e.g. into paragraphs), ask for fewer layers, or use long_texts='truncate'",
                    index=i,
                )

    def _report_truncation(self, encoded: Sequence[EncodedInput]) -> None:
        truncated = [e for e in encoded if e.truncated]
        if truncated:
            first = truncated[0]
            bound = "" if all(e.counts_exact for e in truncated) else "at least "
            logger.warning(
                "%d of %d inputs were longer than %d tokens and were truncated (first: input %d, "
                "%s%d tokens; %s%d words lost in all); their results have truncated=True. Pass "
                "long_texts='window' (CLI: --long-texts window) to keep every token with sliding windows.",
                len(truncated),
                len(encoded),
                self.max_length,
                first.index,
                "" if first.counts_exact else "at least ",
                first.n_tokens_untruncated,
                bound,
                sum(e.words_lost for e in truncated),
            )

    def _progress(self, enabled: bool | None, total: int):
        if enabled is None and total <= 1:
            return None  # one batch: nothing to watch
        return progress_bar("extracting", "inputs", enabled)

    def _run(
        self,
        encoded: list[EncodedInput],
        units: list[EncodedInput | Window],
        owners: list[tuple[int, int]],
        n_windows: dict[int, int],
        batches: list[list[int]],
        layers: tuple[int, ...],
        method: Method,
        taps: tuple[str, ...],
        progress: bool | None,
    ) -> Iterator[tuple[int, LayerStack]]:
        bar = self._progress(progress, len(batches))
        task = bar.add_task("extract", total=len(units)) if bar is not None else None
        pending: dict[int, dict[int, tuple]] = {}  # windows of long inputs until all are done
        with bar if bar is not None else nullcontext():
            for batch_ids in batches:
                batch_units = [units[u] for u in batch_ids]
                rows = self._forward_units(batch_units, layers, method, taps)
                for u, (hidden, tapped) in zip(batch_ids, rows, strict=True):
                    index, k = owners[u]
                    if k < 0:
                        yield index, make_stack(encoded[index], hidden, tapped, layers)
                        continue
                    pending.setdefault(index, {})[k] = (units[u], hidden, tapped)
                    if len(pending[index]) == n_windows[index]:
                        yield index, self._stitch(encoded[index], pending.pop(index), layers)
                if bar is not None:
                    bar.advance(task, len(batch_ids))

    @staticmethod
    def _stitch(item: EncodedInput, parts: dict[int, tuple], layers: tuple[int, ...]) -> LayerStack:
        ordered = [parts[k] for k in range(len(parts))]
        windows = [w for w, _, _ in ordered]
        hidden = stitch([h for _, h, _ in ordered], windows, len(item), token_axis=1)
        taps = {
            name: stitch([t[name] for _, _, t in ordered], windows, len(item), token_axis=1)
            for name in ordered[0][2]
        }
        return make_stack(item, hidden, taps, layers, n_windows=len(windows))

    def _forward_units(
        self,
        units: Sequence[EncodedInput | Window],
        layers: tuple[int, ...],
        method: Method,
        taps: tuple[str, ...],
    ) -> list[tuple]:
        batch = collate(
            units, pad_id=self._pad_id, with_token_types=self._with_token_types, device=self.device
        )
        with self._lock, torch.inference_mode(), self._attention_for(taps):
            hidden, tapped = forward_batch(
                self.model,
                batch,
                layers=layers,
                method=method,
                layer_owner=self._layer_owner,
                layer_attr=self._layer_attr,
                layer_list=self._layer_list,
                model_type=self.model_type,
                taps=taps,
            )
        return split_rows(hidden, tapped, [len(u) for u in units])

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
        long_texts: LongTexts = "truncate",
        stride: int | None = None,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        progress: bool | None = None,
    ) -> np.ndarray:
        """Sentence vectors: ``(n_texts, n_layers, hidden)``, or ``(n_texts, dim)`` with ``fuse``.

        ``pool``: cls, mean or max over the input's tokens; ``special_tokens``: include (default,
        as sentence-transformers) or exclude [CLS]/[SEP]. ``fuse``: a named fusion (last,
        concat_last4, mean_all, …) that picks its own layers, or mean/sum/concat over ``layers``.
        A single string gives a single row."""
        from .features import embed

        return embed(
            self, texts, text_pairs=text_pairs, pairs=pairs, layers=layers, pool=pool, fusion=fuse,
            special_tokens=special_tokens, long_texts=long_texts, stride=stride, batch_size=batch_size,
            max_tokens=max_tokens, progress=progress,
        )  # fmt: skip

    def embed_words(
        self,
        inputs: Sequence[str] | Sequence[Sequence[str]] | None = None,
        *,
        pairs: Sequence[tuple[str, str]] | None = None,
        subword: SubwordPool = "first",
        layers: LayerSpec | None = None,
        fuse: str | None = None,
        long_texts: LongTexts = "truncate",
        stride: int | None = None,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        progress: bool | None = None,
    ) -> list[WordVectors]:
        """Word vectors per input: ``WordVectors.vectors`` is ``(n_layers, n_words, dim)``, or
        ``(n_words, dim)`` with ``fuse``. ``inputs``: raw texts (words found by the tokenizer's
        pre-tokenizer and character offsets) or pre-split word lists (aligned to your words).
        ``subword``: first (default, as in the BERT paper), last, mean, first_last or max."""
        from .features import embed_words

        return embed_words(
            self, inputs, pairs=pairs, subword=subword, layers=layers, fusion=fuse, long_texts=long_texts,
            stride=stride, batch_size=batch_size, max_tokens=max_tokens, progress=progress,
        )  # fmt: skip

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
        batch_size: int | None = None,
        max_tokens: int | None = None,
        progress: bool | None = None,
    ) -> dict[tuple[str, str], np.ndarray]:
        """Every (pool, fusion) combination from ONE forward pass: ``{(pool, fuse): (n_texts, dim)}``.
        ``layers`` feeds the generic fusions (mean, sum, concat); named ones pick their own."""
        from .features import features

        return features(
            self, texts, text_pairs=text_pairs, pairs=pairs, pools=pools, fuses=fuses, layers=layers,
            special_tokens=special_tokens, long_texts=long_texts, stride=stride, batch_size=batch_size,
            max_tokens=max_tokens, progress=progress,
        )  # fmt: skip

    @contextmanager
    def _attention_for(self, taps: tuple[str, ...]) -> Iterator[None]:
        """Attention probabilities exist only in the eager attention path (SDPA never forms them)."""
        current = getattr(self.model.config, "_attn_implementation", None)
        if "attention_probs" not in taps or current in (None, "eager"):
            yield
            return
        self.model.set_attn_implementation("eager")
        try:
            yield
        finally:
            self.model.set_attn_implementation(current)
