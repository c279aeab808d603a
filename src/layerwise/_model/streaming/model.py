"""A model whose weights stay in its checkpoint: a skeleton of its modules on the meta device, each
unit's weights (the embeddings, then each layer) read for one block of texts and released after it.

Extraction is not generation: every text of a block passes layer i before any text needs layer i+1.
So each unit's weights are read from the memory-mapped checkpoint (checkpoint.py, or a GGUF file
de-quantised one tensor at a time, gguf_checkpoint.py), used for the whole block and dropped; the
next unit's are read on a thread while this one runs, so at most two units' weights are resident
at once (:attr:`StreamedModel.peak_resident` counts them; a test holds it). What differs between
an encoder and a decoder (the embeddings, a layer's step, what a batch carries from its embeddings
to every layer) are the hooks a family fills in (encoder.py, decoder.py); forward.py runs the
block.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..notes import note
from .checkpoint import Weights
from .plan import StreamShape

# one layer's step on one batch: (its hidden state (N, H), its prepared batch, what it carries) -> (N, H)
Step = Callable[[torch.Tensor, Any, Any], torch.Tensor]


class StreamedModel(ABC):
    """The streamed weights of one model and its family's hooks: ``units`` (the embeddings, then
    each layer: the modules whose weights load together) inside ``skeleton``, read from
    ``checkpoint`` under ``prefix`` in ``dtype`` onto ``device``."""

    rotary_kinds = 0  # rotary embeddings each batch keeps on the device for a block (a decoder's)

    def __init__(
        self,
        skeleton: Any,
        units: list[list[nn.Module]],
        words: nn.Module,
        checkpoint: Weights,
        prefix: str,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.skeleton, self.checkpoint, self.prefix = skeleton, checkpoint, prefix
        self.dtype, self.device = dtype, device
        self.units = units
        # buffers a unit computes rather than reads (Gemma's embedding scale): kept across releases
        self._computed = [
            [
                (owner, name, buffer)
                for m in modules
                for owner in m.modules()
                for name, buffer in owner.named_buffers(recurse=False)
                if not buffer.is_meta
            ]
            for modules in units
        ]
        self._names = [unit_names(skeleton, modules) for modules in units]
        # the word embeddings are read by row, only the block's token ids (a 128k-token vocabulary
        # outweighs a layer); the batches' ids are renumbered into that small table
        self.words, self._words_shape = words, tuple(words.get_parameter("weight").shape)
        # the block's table holds its own rows only: a padding index past them (a pad id at the end
        # of the vocabulary: OLMo 2, Phi-3, ModernBERT) fails F.embedding's check. It only keeps the
        # pad row's gradient at zero, never changes a forward, and the skeleton is ours
        if isinstance(words, nn.Embedding):
            words.padding_idx = None
        self._words_name = unit_names(skeleton, [words])[0]
        self._names[0].remove(self._words_name)
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="layerwise-weights")
        self._lock = threading.Lock()
        self.resident = 0  # units whose weights are in memory now (the running one, the one read next)
        self.peak_resident = 0
        self._sha256: str | None = None
        note(skeleton, "streamed", self)  # weights_sha256(skeleton) asks this object (weights_hash.py)

    # the family's hooks

    @abstractmethod
    def prepare(self, columns: Any, *, with_token_types: bool, device: torch.device) -> Any:
        """A batch's columns as the family's forward reads them, on ``device``."""

    @abstractmethod
    def embed(self, batch: Any, vocabulary: torch.Tensor) -> torch.Tensor:
        """A batch's embedding output ``(N, H)``; its ids are rows of the block's word table
        (``vocabulary``: the block's ids, sorted; :meth:`renumbered`)."""

    @abstractmethod
    def layer_step(self, depth: int) -> Step:
        """Layer ``depth``'s (1 … n) step on one batch."""

    def carried(self, hidden: torch.Tensor, batch: Any) -> Any:
        """What a batch carries from its embedding output ``hidden`` to every layer, computed on the
        device once a block (a decoder's rotary embedding); None by default."""
        return None

    def after_layer(self, depth: int) -> None:
        """Layer ``depth`` has run every batch of the block (a packed layer drops what it fused)."""
        return None

    # the weights

    def vocabulary(self, batches: Any) -> torch.Tensor:
        """The block's token ids, sorted: the rows of the word table the block reads."""
        return torch.unique(torch.cat([b.ids for b in batches]))

    def stored_names(self) -> list[str]:
        """The checkpoint's names of every weight the units read (the word table's too)."""
        names = [n for unit in self._names for n in unit] + [self._words_name]
        return [self.prefix + n for n in names]

    def unit_bytes(self, k: int) -> int:
        """What unit ``k``'s weights take in memory, in the model's dtype (the embeddings' without the
        word table, whose rows are counted per token)."""
        size = torch.empty((), dtype=self.dtype).element_size()
        words = id(self.words.weight)
        return sum(
            p.numel() * (size if p.is_floating_point() else p.element_size())
            for m in self.units[k]
            for p in m.parameters()
            if id(p) != words
        )

    def shape(self) -> StreamShape:
        """What the block plan reads of this model (plan.py): two units' weights, a token's state,
        its working activations, and what it keeps on the device while the stream waits in host
        memory (three int64 columns: ids, positions, text groups; each rotary embedding's cos and
        sin)."""
        config = self.skeleton.config
        size = torch.empty((), dtype=self.dtype).element_size()
        inner = getattr(config, "intermediate_size", 4 * config.hidden_size)
        held = 24
        if self.rotary_kinds:
            head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            held += 2 * head * self.rotary_kinds * size
        return StreamShape(
            weights=2 * max(self.unit_bytes(k) for k in range(len(self.units))),
            state=size * config.hidden_size,
            work=size * (6 * config.hidden_size + 2 * inner),
            held=held,
            vocab=int(config.vocab_size),
        )

    @staticmethod
    def renumbered(ids: torch.Tensor, vocabulary: torch.Tensor) -> torch.Tensor:
        """``ids`` as rows of the block's word table (``vocabulary``: the block's ids, sorted)."""
        return torch.searchsorted(vocabulary, ids)

    def _read(self, k: int, vocabulary: torch.Tensor) -> dict[str, torch.Tensor]:
        """Unit ``k``'s weights; for the embeddings, the word table's rows of ``vocabulary``."""
        with self._lock:
            self.resident += 1
            self.peak_resident = max(self.peak_resident, self.resident)
        try:
            stored = self.checkpoint.read([self.prefix + n for n in self._names[k]], self.dtype, self.device)
            weights = {n: stored[self.prefix + n] for n in self._names[k]}
            if k == 0:
                name = self.prefix + self._words_name
                rows = self.checkpoint.read_rows(name, vocabulary.tolist(), self.dtype)
                weights[self._words_name] = rows.to(self.device)
        except BaseException:
            self._release_count()
            raise
        return weights

    def _release_count(self) -> None:
        with self._lock:
            self.resident -= 1

    @contextmanager
    def loaded(self, last: int, vocabulary: torch.Tensor) -> Iterator[Iterator[int]]:
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
                    self._release(k)

        walker = walk()
        try:
            yield walker
        finally:
            walker.close()  # a failure mid-block: the running unit is released now, not at collection
            for future in ahead:  # and the one read ahead
                if future.exception() is None:
                    self._release_count()

    def _release(self, k: int) -> None:
        """Unit ``k``'s weights back to the meta device (the buffers it computes kept)."""
        for module in self.units[k]:
            module.to_empty(device=torch.device("meta"))
        for owner, name, buffer in self._computed[k]:
            owner._buffers[name] = buffer
        if k == 0:
            meta = torch.empty(self._words_shape, device="meta")
            self.words.weight = nn.Parameter(meta, requires_grad=False)
        self._release_count()

    def weights_sha256(self) -> str:
        """:func:`~layerwise._model.loading.weights_hash.weights_sha256`'s digest of the in-memory model
        (every tensor's name and bytes in the model's dtype, by name), from the checkpoint, once."""
        if self._sha256 is None:  # one tensor read at a time, by name, as the in-memory hash orders them
            from ..loading.weights_hash import tensors_sha256

            cpu, prefix = torch.device("cpu"), self.prefix
            names = sorted(self.skeleton.state_dict())
            read = ((n, self.checkpoint.read([prefix + n], self.dtype, cpu)[prefix + n]) for n in names)
            self._sha256 = tensors_sha256(read)
        return self._sha256


def unit_names(skeleton: nn.Module, modules: list[nn.Module]) -> list[str]:
    """The state-dict names of ``modules`` inside ``skeleton``."""
    owned = {id(p) for m in modules for p in m.parameters()} | {id(b) for m in modules for b in m.buffers()}
    state = skeleton.state_dict(keep_vars=True)
    return [name for name, tensor in state.items() if id(tensor) in owned]
