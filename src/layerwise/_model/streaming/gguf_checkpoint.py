"""A GGUF file's tensors under the transformers model's names, de-quantised one tensor at a time: what
the layer-streamed forward (streaming/forward.py) reads a layer from, so that a 7B GGUF file never becomes
28 GB of float32 at once. The same reader as :class:`~layerwise._model.streaming.checkpoint.Checkpoint`.

The file is memory-mapped (gguf's GGUFReader); each tensor is de-quantised with gguf's own
``dequantize`` and put in transformers' layout by transformers' own tensor processor for the
architecture (llama.cpp permutes Llama's query and key rows for its rotary embedding; the
processor puts them back), so the numbers are those of ``from_pretrained(gguf_file=...)``. The word
table is de-quantised by row: only the rows of a block's token ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from ..loading.gguf_files import gguf_loading


class GgufCheckpoint:
    """Tensor name (transformers') -> the GGUF tensor; :meth:`read` de-quantises some of them."""

    def __init__(self, path: str, config: Any) -> None:
        import gguf
        from transformers import AutoModel
        from transformers.modeling_gguf_pytorch_utils import (
            TENSOR_PROCESSORS,
            TensorProcessor,
            get_gguf_hf_weights_map,
            read_field,
        )

        reader = gguf.GGUFReader(path)  # memory-mapped: nothing read until a tensor is
        architecture = read_field(reader, "general.architecture")[0]
        self._config = {"config": config.to_dict(), "tensors": {}}
        self.processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=self._config["config"])
        with torch.device("meta"):
            skeleton = AutoModel.from_config(config)  # its state dict's names, nothing allocated
        with gguf_loading():
            mapping = get_gguf_hf_weights_map(skeleton, self.processor)  # GGUF name -> transformers'
        self.tensors = {mapping[t.name]: t for t in reader.tensors if t.name in mapping}

    def names(self) -> set[str]:
        return set(self.tensors)

    def _weights(self, name: str, data: np.ndarray) -> np.ndarray:
        tensor = self.tensors[name]
        import gguf

        weights = gguf.dequantize(data, tensor.tensor_type)
        kwargs = {"tensor_key_mapping": {}, "parsed_parameters": self._config}
        return self.processor.process(weights=weights, name=tensor.name, **kwargs).weights

    def read(self, names: Iterable[str], dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
        """``names``' tensors de-quantised, in ``dtype`` (as ``from_pretrained`` casts), on ``device``."""
        out = {}
        for name in names:
            weights = self._weights(name, self.tensors[name].data)
            out[name] = torch.from_numpy(np.array(weights, copy=True)).to(dtype).to(device)
        return out

    def read_rows(self, name: str, rows: list[int], dtype: torch.dtype) -> torch.Tensor:
        """Rows ``rows`` of the 2-D tensor ``name`` (a quantised row is whole blocks: it de-quantises
        alone), in ``dtype``."""
        if not rows:
            return torch.empty(0)
        data = self.tensors[name].data[np.asarray(rows)]
        return torch.from_numpy(np.array(self._weights(name, data), copy=True)).to(dtype)
