"""The Ray actors: each loads the Encoder once, from the driver's Settings, whole, and then embeds
batches of texts (:class:`EmbedActor`) or writes whole shards of a sharded store (:class:`ShardWriter`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._features.plan import OutputPlan
from .._settings.settings import Settings
from ..store._format import StoreLayout


class ModelActor:
    """Loads the Encoder once per actor, from the driver's Settings, whole."""

    def __init__(self, settings: Settings, threads: int) -> None:
        import torch

        from .._encoder import Encoder

        torch.set_num_threads(threads)
        # each actor gets CPUs from Ray: "auto" would pick CUDA where the actor sees one; GPU actors
        # ask for device="cuda" (one GPU each)
        if settings.device == "auto":
            settings = settings.replace(device="cpu")
        self.encoder = Encoder.from_settings(settings)


class EmbedActor(ModelActor):
    def __init__(self, settings: Settings, threads: int, plan: OutputPlan, column: str, output_column: str):
        super().__init__(settings, threads)
        self.plan, self.column, self.output_column = plan, column, output_column

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        from .._results import to_dtype

        column = batch[self.column]
        # an image or a speech model takes the column as it is: paths, bytes (read_binary_files),
        # arrays (read_images)
        texts = [str(t) for t in column] if self.encoder.modality == "text" else list(column)
        rows: list[Any] = [None] * len(texts)
        for index, _, result in self.encoder.iter_results(self.plan, texts, progress=False):
            rows[index] = result.vector  # type: ignore[union-attr]
        return {**batch, self.output_column: to_dtype(np.stack(rows), self.plan.dtype, "a batch of texts")}


class ShardWriter(ModelActor):
    """Writes whole shards (one row of the shard dataset each) with the ordinary store writer."""

    def __init__(
        self,
        settings: Settings,
        threads: int,
        plan: OutputPlan,
        path: str,
        table: dict,
        layout: StoreLayout,
        corpus: Any = None,
    ) -> None:
        super().__init__(settings, threads)
        self.plan, self.path, self.table, self.layout, self.corpus = plan, Path(path), table, layout, corpus

    def __call__(self, batch: dict) -> dict:
        out: dict[str, list] = {
            "shard": [],
            "n_texts": [],
            "n_written": [],
            "n_rows": [],
            "seconds": [],
            "n_truncated": [],
        }
        for row, k in enumerate(batch["shard"]):
            if self.corpus is not None:  # a file corpus: this actor reads its shard's rows itself
                shard = self.table["shards"][int(k)]
                size = shard["stop"] - shard["start"]
                block = next(self.corpus.blocks(size, start=shard["start"], stop=shard["stop"]))
                summary = self.write_shard(int(k), block.texts, block.text_pairs, block.ids)
            else:
                pairs = batch["text_pairs"][row]
                text_pairs = None if pairs is None or len(pairs) == 0 else [str(p) for p in pairs]
                summary = self.write_shard(int(k), [str(t) for t in batch["texts"][row]], text_pairs)
            out["shard"].append(int(k))
            out["n_texts"].append(summary.n_texts)
            out["n_written"].append(summary.n_written)
            out["n_rows"].append(summary.n_rows)
            out["seconds"].append(summary.seconds)
            out["n_truncated"].append(summary.n_truncated)
        return out

    def write_shard(
        self, index: int, texts: list[str], text_pairs: list[str] | None, ids: list | None = None
    ):
        from ..store._shard_writer import write_shard

        return write_shard(
            self.encoder,
            self.path,
            self.table,
            index,
            texts,
            text_pairs,
            self.plan,
            ids=ids,
            layout=self.layout,
        )
