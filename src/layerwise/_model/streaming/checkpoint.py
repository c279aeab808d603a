"""A checkpoint's tensors read by name from memory-mapped safetensors files: one ``model.safetensors``
or the shards ``model.safetensors.index.json`` lists. The layer-streamed forward (streaming/forward.py) reads
one layer's weights from here when it needs them, never the whole model."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import torch

from ...errors import ModelLoadError
from ..loading.checkpoint_files import INDEX, header_keys, indexed, reading


class Weights(Protocol):
    """What the streamed forward reads weights from: a safetensors :class:`Checkpoint`, or a GGUF
    file de-quantised tensor by tensor (gguf_checkpoint.py)."""

    def names(self) -> set[str]: ...

    def read(
        self, names: Iterable[str], dtype: torch.dtype, device: torch.device
    ) -> dict[str, torch.Tensor]: ...

    def read_rows(self, name: str, rows: list[int], dtype: torch.dtype) -> torch.Tensor: ...


class Checkpoint:
    """Tensor name -> the safetensors file that holds it; :meth:`read` reads some of them. Which file
    holds which tensor is read from the files' own headers (an index only lists the files), so a
    damaged, missing or mislabelled file is named when the checkpoint is opened, not midway through
    a run."""

    def __init__(self, files: dict[str, Path], name: str = "") -> None:
        self.files, self.name = files, name

    @classmethod
    def find(cls, source: str, name: str) -> Checkpoint:
        """The checkpoint of ``source`` (a folder, or a hub name in the local cache), or an error that
        says what to convert: streaming reads weights memory-mapped, which only safetensors allows;
        a file it cannot read is named, with the fix."""
        from ..loading.light import weights_file

        single = weights_file(source)
        folder = Path(source) if Path(source).is_dir() else single.parent if single is not None else None
        if single is not None:
            return cls(dict.fromkeys(header_keys(single, name), single), name)
        if folder is not None and (folder / INDEX).is_file():
            return cls(indexed(folder, name), name)
        raise ModelLoadError(
            f"model {name!r}: streaming reads each layer's weights memory-mapped from safetensors (or a "
            "GGUF file), and its weights are not in that format. Convert it once: load it in memory and "
            "save it with "
            "model.save_pretrained(folder) (safetensors is the default), then stream the folder"
        )

    def names(self) -> set[str]:
        return set(self.files)

    def read(self, names: Iterable[str], dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
        """``names``' tensors, floating ones cast to ``dtype`` (as ``from_pretrained`` casts them), on
        ``device``."""
        from safetensors import safe_open

        out = {}
        for file, keys in self._by_file(names).items():
            with reading(file, self.name), safe_open(str(file), framework="pt") as handle:
                for key in keys:
                    tensor = handle.get_tensor(key)
                    if tensor.is_floating_point():
                        tensor = tensor.to(dtype)
                    out[key] = tensor.to(device)
        return out

    def check_shapes(self, expected: dict[str, torch.Tensor], name: str) -> None:
        """Refuse, naming the first, a stored tensor whose shape differs from the model's (a config
        that lies about its width, heads or vocabulary; a transposed weight) or that holds no numbers
        the model can read (an integer or boolean weight where the model has a floating one), read
        from the files' headers alone."""
        from safetensors import safe_open

        for file, keys in self._by_file(expected).items():
            with reading(file, self.name), safe_open(str(file), framework="pt") as handle:
                for key in keys:
                    stored = handle.get_slice(key)
                    shape, kind = tuple(stored.get_shape()), str(stored.get_dtype())
                    want = expected[key]
                    if shape != tuple(want.shape):
                        raise ModelLoadError(
                            f"model {name!r}: {key!r} in {file.name} has the shape {shape}, and its "
                            f"config.json makes it {tuple(want.shape)}; the config and the weights do not "
                            "belong together: use the config the weights were saved with"
                        )
                    if want.is_floating_point() and not kind.startswith(("F", "BF")):
                        raise ModelLoadError(
                            f"model {name!r}: {key!r} in {file.name} holds {kind} numbers, where the model "
                            "reads floating-point weights; the checkpoint is damaged: download it again"
                        )

    def element_count(self) -> int:
        """How many numbers the checkpoint holds, from the files' headers alone (no tensor is read)."""
        from safetensors import safe_open

        count = 0
        for file, keys in self._by_file(self.files).items():
            with reading(file, self.name), safe_open(str(file), framework="pt") as handle:
                count += sum(int(torch.Size(handle.get_slice(key).get_shape()).numel()) for key in keys)
        return count

    def _by_file(self, names: Iterable[str]) -> dict[Path, list[str]]:
        names = list(names)
        if any(key not in self.files for key in names):  # named, never a KeyError
            missing_weights(self, names, self.name)
        by_file: dict[Path, list[str]] = {}
        for key in names:
            by_file.setdefault(self.files[key], []).append(key)
        return by_file

    def read_rows(self, name: str, rows: list[int], dtype: torch.dtype) -> torch.Tensor:
        """Rows ``rows`` (sorted, unique) of the 2-D tensor ``name``, in ``dtype``: each run of
        consecutive rows read as one slice of the memory-mapped file, nothing else of the tensor."""
        from safetensors import safe_open

        runs: list[tuple[int, int]] = []
        for row in rows:
            if runs and runs[-1][1] == row:
                runs[-1] = (runs[-1][0], row + 1)
            else:
                runs.append((row, row + 1))
        with (
            reading(self.files[name], self.name),
            safe_open(str(self.files[name]), framework="pt") as handle,
        ):
            table = handle.get_slice(name)
            parts = [table[start:stop] for start, stop in runs]
        return torch.cat(parts).to(dtype) if parts else torch.empty(0)


def missing_weights(checkpoint: Weights, needed: Iterable[str], name: str) -> None:
    """Refuse a checkpoint that lacks a weight the model needs, naming the first one."""
    missing = sorted(set(needed) - checkpoint.names())
    if missing:
        raise ModelLoadError(
            f"model {name!r}: its checkpoint holds no tensor {missing[0]!r}"
            + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else "")
            + "; the weights are incomplete: download the model again, or save it with "
            "model.save_pretrained(folder)"
        )
