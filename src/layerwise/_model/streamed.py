"""Layer-streamed forward: every layer of a model larger than memory, each layer's weights read once
per block of texts.

Extraction is not generation: every text of a block passes layer i before any text needs layer i+1.
So the block's residual stream stays where the model runs while the weights stream in, one unit at
a time: the embeddings over every batch of the block, then layer 1 over every batch, and so on.
Each unit's weights are read from the memory-mapped checkpoint (checkpoint.py), used for the whole
block and dropped; the next unit's are read on a thread while this one runs, so at most two units'
weights are resident at once (:attr:`StreamedForward.peak_resident` counts them; a test holds it).

The numbers are the in-memory packed forward's: the same modules run the same ops (packed.py for
BERT-family encoders; the decoder layers' own forward with the packed attention,
packed_decoder.py). Supported: the encoders of the packed forward, and the decoders of the Llama
and Gemma families (streamable.py), from safetensors or a GGUF file (de-quantised
one tensor at a time, gguf_checkpoint.py). How large a block is: stream_block.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from torch import nn

from ..errors import ModelLoadError, OptionError
from .checkpoint import Checkpoint, Weights
from .decoders import final_norm_module, is_decoder_config
from .gguf_files import gguf_parts
from .stream_residual import Residual
from .streamable import check_streamable

# what a block keeps of batch i's hidden state ``depth`` ``(N, H)``: the state itself, or less (the
# call's pools: _batch_runs.py), computed as soon as the layer is, so the block never holds every layer
Keep = Callable[[int, int, torch.Tensor], torch.Tensor]
After = Callable[[int, torch.Tensor], None]  # what a layer does with batch i's output on the device


def _as_is(i: int, depth: int, hidden: torch.Tensor) -> torch.Tensor:
    return hidden


class StreamedForward:
    """The streamed forward of one model: a skeleton of its modules on the meta device, each unit's
    weights assigned from the checkpoint for one block and released after it."""

    rotary_kinds = 0  # rotary embeddings each batch keeps on the device for a block (a decoder's)

    def __init__(self, skeleton: Any, units: list[list[nn.Module]], words: nn.Module,
                 checkpoint: Weights, prefix: str, dtype: torch.dtype,
                 device: torch.device) -> None:  # fmt: skip
        self.skeleton, self.checkpoint, self.prefix = skeleton, checkpoint, prefix
        self.dtype, self.device = dtype, device
        self.units = units  # the embeddings, then each layer: the modules whose weights load together
        # buffers a unit computes rather than reads (Gemma's embedding scale): kept across releases
        self._computed = [[(owner, name, buffer) for m in modules for owner in m.modules()
                           for name, buffer in owner.named_buffers(recurse=False) if not buffer.is_meta]
                          for modules in units]  # fmt: skip
        self._names = [_unit_names(skeleton, modules) for modules in units]
        # the word embeddings are read by row, only the block's token ids (a 128k-token vocabulary
        # outweighs a layer); the batches' ids are renumbered into that small table
        self.words, self._words_shape = words, tuple(words.get_parameter("weight").shape)
        self._words_name = _unit_names(skeleton, [words])[0]
        self._names[0].remove(self._words_name)
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="layerwise-weights")
        self._lock = threading.Lock()
        self.resident = 0  # units whose weights are in memory now (the running one, the one read next)
        self.peak_resident = 0
        self._sha256: str | None = None
        self.pool: Any = None  # the engine's forward streams on a CPU (_model/streams.py), if any
        self.residual = Residual(device, on_host=False)  # in host memory: chosen by stream_block.py
        skeleton._layerwise_streamed = self  # weights_sha256(skeleton) asks this object (source.py)

    def unit_bytes(self, k: int) -> int:
        """What unit ``k``'s weights take in memory, in the model's dtype (the embeddings' without the
        word table, whose rows are counted per token)."""
        size = torch.empty((), dtype=self.dtype).element_size()
        words = id(self.words.weight)
        return sum(p.numel() * (size if p.is_floating_point() else p.element_size())
                   for m in self.units[k] for p in m.parameters() if id(p) != words)  # fmt: skip

    def _read(self, k: int, vocabulary: torch.Tensor) -> dict[str, torch.Tensor]:
        """Unit ``k``'s weights; for the embeddings, the word table's rows of ``vocabulary``."""
        with self._lock:
            self.resident += 1
            self.peak_resident = max(self.peak_resident, self.resident)
        try:
            stored = self.checkpoint.read([self.prefix + n for n in self._names[k]], self.dtype, self.device)
            weights = {n: stored[self.prefix + n] for n in self._names[k]}
            if k == 0:
                rows = self.checkpoint.read_rows(
                    self.prefix + self._words_name, vocabulary.tolist(), self.dtype
                )
                weights[self._words_name] = rows.to(self.device)
        except BaseException:
            self._release_count()
            raise
        return weights

    @staticmethod
    def renumbered(ids: torch.Tensor, vocabulary: torch.Tensor) -> torch.Tensor:
        """``ids`` as rows of the block's word table (``vocabulary``: the block's ids, sorted)."""
        return torch.searchsorted(vocabulary, ids)

    def _release_count(self) -> None:
        with self._lock:
            self.resident -= 1

    @contextmanager
    def _units(self, last: int, vocabulary: torch.Tensor) -> Iterator[Iterator[int]]:
        """Units 0 … ``last`` in turn, each one's weights assigned while the caller runs it and the
        next one's read meanwhile on a thread; released after, also when the block fails. The word
        table holds the rows of ``vocabulary``, the block's token ids."""
        ahead: list[Future] = [self._reader.submit(self._read, 0, vocabulary)]

        def walk() -> Generator[int, None, None]:
            for k in range(last + 1):
                weights = ahead.pop().result()
                if k < last:
                    ahead.append(self._reader.submit(self._read, k + 1, vocabulary))
                if k == 0:  # the block's rows: a table of its own shape
                    self.words.weight = nn.Parameter(weights.pop(self._words_name), requires_grad=False)
                self.skeleton.load_state_dict(weights, strict=False, assign=True)
                del weights
                try:
                    yield k
                finally:
                    for module in self.units[k]:
                        module.to_empty(device=torch.device("meta"))
                    for owner, name, buffer in self._computed[k]:
                        owner._buffers[name] = buffer
                    if k == 0:
                        meta = torch.empty(self._words_shape, device="meta")
                        self.words.weight = nn.Parameter(meta, requires_grad=False)
                    self._release_count()

        walker = walk()
        try:
            yield walker
        finally:
            walker.close()  # a failure mid-block: the running unit is released now, not at collection
            for future in ahead:  # and the one read ahead
                if future.exception() is None:
                    self._release_count()

    def _each(self, step: Callable[..., torch.Tensor], items: list[tuple], after: After, *, last: bool,
              moving: bool = True) -> list[torch.Tensor]:  # fmt: skip
        """``step(*item)`` for each batch's item, ``after(i, output)`` on each output: through the
        residual stream's place (stream_residual.py), or on the engine's forward streams when it has
        them (``pool``: batches of one layer are independent, as the in-memory forward runs them)."""
        if self.pool is None or len(items) < 2 or self.residual.on_host:
            return self.residual.run(step, items, after, last=last, moving=moving)

        def run(item: tuple) -> torch.Tensor:
            with torch.inference_mode():  # thread-local: each stream enters it
                return step(*item)

        futures = [self.pool.submit(run, item) for item in items]
        items.clear()  # each input let go once its batch has run, as Residual.run does
        outputs = [future.result() for future in futures]
        for i, output in enumerate(outputs):
            after(i, output)
        return outputs

    def weights_sha256(self) -> str:
        """:func:`~layerwise._model.source.weights_sha256`'s digest of the in-memory model (every
        tensor's name and bytes in the model's dtype, by name), from the checkpoint, once."""
        if self._sha256 is None:  # one tensor read at a time, by name, as the in-memory hash orders them
            from .source import tensors_sha256

            cpu, prefix = torch.device("cpu"), self.prefix
            names = sorted(self.skeleton.state_dict())
            read = ((n, self.checkpoint.read([prefix + n], self.dtype, cpu)[prefix + n]) for n in names)
            self._sha256 = tensors_sha256(read)
        return self._sha256

    def costs(self) -> tuple[int, int, int]:
        """``(weights, stream, work)`` in bytes: two units' weights (the running one and the one read
        ahead); per token of a block, its residual stream and word-table row; per token of the batch
        a layer is running, its working activations (queries, keys, values, context, the
        feed-forward's inner width twice)."""
        config = self.skeleton.config
        size = torch.empty((), dtype=self.dtype).element_size()
        inner = getattr(config, "intermediate_size", 4 * config.hidden_size)
        weights = 2 * max(self.unit_bytes(k) for k in range(len(self.units)))
        return weights, 2 * size * config.hidden_size, size * (6 * config.hidden_size + 2 * inner)

    def fit(
        self, budget: int, budget_text: str, max_length: int, max_tokens: int, streams: int = 1
    ) -> tuple[int, int]:
        """``(block tokens, batch tokens)`` that ``budget`` bytes hold: two units' weights, the
        working activations of the batches running at once (``streams``: at most half of what is
        left, and at least one text's each), and the block's residual stream. A budget short of one
        text is refused, with both sizes."""
        weights, stream, work = self.costs()
        work *= streams
        left = budget - weights
        batch = min(max_tokens, max(max_length, left // (2 * work)))
        block = (left - batch * work) // stream
        if block < max_length:
            needed = weights + max_length * (work + stream)
            raise OptionError(
                f"max_device_memory={budget_text!r} ({budget:,} bytes) is too small to stream this model: "
                f"two layers' weights take {weights:,} bytes and one text of {max_length} tokens "
                f"{max_length * (work + stream):,} bytes more; give at least {needed:,} bytes"
            )
        return int(block), int(batch)


def _unit_names(skeleton: nn.Module, modules: list[nn.Module]) -> list[str]:
    """The state-dict names of ``modules`` inside ``skeleton``."""
    owned = {id(p) for m in modules for p in m.parameters()} | {id(b) for m in modules for b in m.buffers()}
    state = skeleton.state_dict(keep_vars=True)
    return [name for name, tensor in state.items() if id(tensor) in owned]


class StreamedEncoder(StreamedForward):
    """A BERT-family encoder, streamed: the packed forward's own layer function (packed.py)."""

    def __init__(self, config: Any, checkpoint: Weights, prefix: str, dtype: torch.dtype,
                 device: torch.device, *, pooler: bool) -> None:  # fmt: skip
        from .light import LightModel
        from .packed import PackedEncoder

        skeleton = LightModel(config, pooler=pooler)  # every weight on the meta device
        self.packed = PackedEncoder(skeleton)
        first = [
            skeleton.embeddings,
            *([skeleton.embeddings_project] if self.packed.project is not None else []),
        ]
        units = [first, *[[layer] for layer in self.packed.layers]]
        super().__init__(
            skeleton, units, skeleton.embeddings.word_embeddings, checkpoint, prefix, dtype, device
        )

    def prepare(self, columns: Any, *, with_token_types: bool, device: torch.device) -> Any:
        return self.packed.prepare(columns, with_token_types=with_token_types, device=device)

    def forward_block(
        self, batches: Sequence[Any], layers: Sequence[int], keep: Keep = _as_is
    ) -> list[torch.Tensor]:
        """Hidden states ``layers`` of every batch of a block: ``(len(layers), N_b, H)`` each."""
        wanted = set(layers)
        kept: list[dict[int, torch.Tensor]] = [{} for _ in batches]
        hidden: list[torch.Tensor] = []
        vocabulary = torch.unique(torch.cat([b.ids for b in batches]))

        def embed(batch: Any) -> torch.Tensor:
            return self.packed.embed(replace(batch, ids=self.renumbered(batch.ids, vocabulary)))

        with self._units(max(layers), vocabulary) as units:
            for depth in units:

                def after(i: int, h: torch.Tensor, depth: int = depth) -> None:
                    if depth in wanted:  # what the call keeps of it, as soon as it is computed
                        kept[i][depth] = keep(i, depth, h)

                last = depth == max(layers)
                if depth == 0:
                    hidden = self._each(embed, [(b,) for b in batches], after, last=last, moving=False)
                else:
                    layer = self.packed.layers[depth - 1]
                    items = list(zip(hidden, batches, strict=True))
                    hidden.clear()  # each state let go as its batch runs (stream_residual.py)
                    hidden = self._each(partial(self.packed.run_layer, layer), items, after, last=last)
                    self.packed.forget(layer)
        return [torch.stack([store[i] for i in layers]) for store in kept]


class StreamedDecoder(StreamedForward):
    """A decoder LM (Llama, Gemma, GPT-2 families), streamed: each decoder layer's own forward, with
    the packed attention (packed_decoder.py) over each batch's per-text grids."""

    def __init__(self, config: Any, checkpoint: Weights, prefix: str, dtype: torch.dtype,
                 device: torch.device) -> None:  # fmt: skip
        from transformers import AutoModel

        from .packed_decoder import register_packed_attention

        register_packed_attention()
        with torch.device("meta"):
            skeleton = AutoModel.from_config(config, dtype=dtype).eval()  # no dropout, as in memory
        # GPT-2: learned positions (wpe, read with the embeddings), its layers h, no rotary embedding
        gpt2 = config.model_type == "gpt2"
        words = skeleton.wte if gpt2 else skeleton.embed_tokens
        self._positions = skeleton.wpe if gpt2 else None
        # buffers computed at construction (the rotary frequencies, Gemma's embedding scale) must be
        # real numbers
        if not gpt2:
            skeleton.rotary_emb = type(skeleton.rotary_emb)(skeleton.config).to(device)
        if hasattr(words, "embed_scale"):  # Gemma's embeddings times sqrt(hidden)
            skeleton.embed_tokens.embed_scale = torch.tensor(float(config.hidden_size) ** 0.5, device=device)
        # Gemma 3: a rotary embedding per layer type (full and sliding attention)
        types = getattr(config, "layer_types", None) if config.model_type == "gemma3_text" else None
        self._layer_types, self.rotary_kinds = types, 0 if gpt2 else len(set(types or [None]))
        final_norm = [prefix + n for n in _unit_names(skeleton, [final_norm_module(skeleton)])]
        norm = checkpoint.read(final_norm, dtype, device)
        skeleton.load_state_dict({k[len(prefix) :]: v for k, v in norm.items()}, strict=False, assign=True)
        layers = list(skeleton.h if gpt2 else skeleton.layers)
        embeddings = [words] if self._positions is None else [words, self._positions]
        units = [embeddings, *[[layer] for layer in layers]]
        super().__init__(skeleton, units, words, checkpoint, prefix, dtype, device)
        self.layers = layers

    def _rotary(self, hidden: torch.Tensor, positions: torch.Tensor) -> Any:
        """The rotary embedding of a batch's positions: one, or Gemma 3's one per layer type (GPT-2:
        none)."""
        if self._positions is not None:
            return None
        if self._layer_types is None:
            return self.skeleton.rotary_emb(hidden, positions)
        return {kind: self.skeleton.rotary_emb(hidden, positions, kind) for kind in set(self._layer_types)}

    def _embed(self, ids: torch.Tensor, batch: Any) -> torch.Tensor:
        """The embeddings of a batch (``ids``: rows of the block's word table): GPT-2 adds its learned
        positions, which restart at each text as the packed forward numbers them."""
        hidden = self.words(ids)
        return hidden if self._positions is None else hidden + self._positions(batch.positions[None])

    def prepare(self, columns: Any, *, with_token_types: bool = False, device: torch.device) -> Any:
        from .packed_decoder import prepare_decoder_batch

        return prepare_decoder_batch(columns, device)

    def forward_block(
        self, batches: Sequence[Any], layers: Sequence[int], keep: Keep = _as_is
    ) -> list[torch.Tensor]:
        """Hidden states ``layers`` of every batch of a block: ``(len(layers), N_b, H)`` each, the raw
        residual stream (the engine applies the final norm a call asks for)."""
        from .packed_decoder import ATTENTION, PackedRun, attention_implementation, running_packed

        wanted = set(layers)
        kept: list[dict[int, torch.Tensor]] = [{} for _ in batches]
        hidden: list[torch.Tensor] = []
        rotary: list[Any] = [None] * len(batches)
        config = self.skeleton.config
        vocabulary = torch.unique(torch.cat([b.ids for b in batches]))
        with self._units(max(layers), vocabulary) as units, attention_implementation(config, ATTENTION):
            for depth in units:

                def after(i: int, h: torch.Tensor, depth: int = depth) -> None:
                    if depth == 0:  # each batch's rotary embedding, on the device for every layer
                        rotary[i] = self._rotary(h, batches[i].positions[None])
                    if depth in wanted:  # what the call keeps of it, as soon as it is computed
                        kept[i][depth] = keep(i, depth, h[0])

                last = depth == max(layers)
                if depth == 0:  # (1, N, H) each
                    hidden = self._each(lambda b: self._embed(self.renumbered(b.ids, vocabulary)[None], b),
                                        [(b,) for b in batches], after, last=last, moving=False)  # fmt: skip
                else:
                    layer = self.layers[depth - 1]
                    kind = None if self._layer_types is None else self._layer_types[depth - 1]

                    def step(h: torch.Tensor, batch: Any, rotated: Any, layer: Any = layer,
                             kind: str | None = kind) -> torch.Tensor:  # fmt: skip
                        rotated = rotated if kind is None else rotated[kind]
                        given = {} if rotated is None else {"position_embeddings": rotated}
                        with running_packed(PackedRun(batch.groups)):  # this thread's grids
                            return layer(h, attention_mask=None, position_ids=batch.positions[None],
                                         use_cache=False, **given)  # fmt: skip

                    items = list(zip(hidden, batches, rotary, strict=True))
                    hidden.clear()  # each state let go as its batch runs (stream_residual.py)
                    hidden = self._each(step, items, after, last=last)
        return [torch.stack([store[i] for i in layers]) for store in kept]


def streamed_forward(source: str, name: str, config: Any, dtype: torch.dtype,
                     device: torch.device) -> StreamedForward:  # fmt: skip
    """The streamed forward of ``source`` (refusing what it cannot stream, naming the fix)."""
    check_streamable(config, name)
    if gguf_parts(source) is not None:  # de-quantised tensor by tensor, as each layer is read
        from .gguf_checkpoint import GgufCheckpoint

        checkpoint: Weights = GgufCheckpoint(source, config)
    else:
        checkpoint = Checkpoint.find(source, name)
    stored = checkpoint.names()
    if is_decoder_config(config):
        layers = "h." if config.model_type == "gpt2" else "layers."  # under a head model's prefix?
        prefix = next(
            (p for p in ("model.", "transformer.") if any(k.startswith(p + layers) for k in stored)), ""
        )
        return StreamedDecoder(config, checkpoint, prefix, dtype, device)
    from .light import base_prefix

    base = base_prefix(config, stored)
    if base is None:
        raise ModelLoadError(
            f"model {name!r}: its checkpoint does not hold every weight of the encoder under the model's "
            "names; load it in memory (streaming=False), or save it again with model.save_pretrained(folder)"
        )
    pooler = f"{base}pooler.dense.weight" in stored and config.model_type != "electra"
    return StreamedEncoder(config, checkpoint, base, dtype, device, pooler=pooler)
