"""A model that accelerate places: spread over devices by a device map (several GPUs, the CPU, the
disk), or in 8/4-bit weights (bitsandbytes). transformers loads it (``from_pretrained(device_map=,
max_memory=, offload_folder=, quantization_config=)``) and it runs transformers' own forward, whose
accelerate hooks move each layer's input to that layer's device: the packed forward would bypass
them (an offloaded layer's weights are not there until its hook loads them).

Each hidden state is gathered onto the device the inputs went to before anything reads it, and a
layer whose states came back all zeros stops the run: that is how a failed copy between devices
shows (transformers issue 36636, later layers of a model spread over GPUs returning zeros).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..._settings.placement import device_map_value, memory_caps
from ..._settings.settings import Settings
from ...errors import MissingDependencyError, ModelLoadError, OptionError
from .plain import transformers_config


@dataclass
class Placement:
    """What ``from_pretrained`` takes to place the model (``kwargs``), and an offload folder made
    here (``temporary``), removed with the model."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    temporary: str | None = None
    given_holds: frozenset[str] | None = None  # what a given offload folder held before the load

    def adopt(self, model: Any) -> None:
        """``model`` was loaded with this placement: the offload folder this run made goes when it
        does (at the latest when the process exits), and what the load wrote into a folder that was
        there before, leaving it as it was."""
        if self.temporary is not None:
            weakref.finalize(model, shutil.rmtree, self.temporary, ignore_errors=True)
        elif self.given_holds is not None:
            weakref.finalize(model, _remove_new_entries, self.kwargs["offload_folder"], self.given_holds)

    def discard(self) -> None:
        """The load failed: remove the folder this run made now, or what the load wrote into a given one."""
        if self.temporary is not None:
            shutil.rmtree(self.temporary, ignore_errors=True)
        elif self.given_holds is not None:
            _remove_new_entries(self.kwargs["offload_folder"], self.given_holds)


def _remove_new_entries(folder: str, held: frozenset[str]) -> None:
    """The entries of ``folder`` that were not among ``held``."""
    with contextlib.suppress(OSError):
        for entry in set(os.listdir(folder)) - held:
            path = Path(folder) / entry
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def placement_of(
    settings: Settings, config: Any, device: torch.device, dtype: torch.dtype, source: str
) -> Placement | None:
    """The placement ``settings`` ask for (None: the whole model on ``device``), every device and
    module it names checked before anything loads; ``dtype``: the model's (4-bit weights compute in it);
    ``source``: where the config was read (a device map is checked on transformers' own config class)."""
    if settings.device_map is None and settings.quantize == "none":
        return None
    placement = Placement()
    if settings.quantize != "none":
        placement.kwargs["quantization_config"] = _bitsandbytes(settings, device, dtype)
        placement.kwargs["device_map"] = {"": device.index or 0}
    if settings.device_map is None:
        return placement
    try:
        import accelerate  # noqa: F401  (transformers places the model with it)
    except ImportError:
        hint = "pip install 'layerwise[accelerate]'"
        raise MissingDependencyError(f"device_map needs accelerate: {hint}") from None
    value = device_map_value(settings.device_map)
    if isinstance(value, dict):
        for module, where in value.items():
            _check_device(where, f"device_map puts {module!r} on {where!r}")
        # the map is checked on the model transformers builds: from its own config class (plain.py)
        real = transformers_config(config, source)
        _check_modules(value, real, trust_remote_code=settings.trust_remote_code)
    placement.kwargs["device_map"] = value
    if settings.max_device_memory is not None:
        placement.kwargs["max_memory"] = _max_memory(settings.max_device_memory)
    folder, placement.temporary = _offload_folder(settings.offload_folder)
    placement.kwargs["offload_folder"] = folder
    if placement.temporary is None:
        placement.given_holds = frozenset(os.listdir(folder))
    return placement


def input_device(model: Any) -> torch.device:
    """Where a placed model takes its inputs: the device of its first module in the map (the
    embeddings), the CPU for modules offloaded to disk."""
    mapping = getattr(model, "hf_device_map", None) or {}
    for where in mapping.values():
        if where == "disk":
            return torch.device("cpu")
        return torch.device(f"cuda:{where}" if isinstance(where, int) else where)
    return next(model.parameters()).device


def offloaded_tensor(model: Any, name: str) -> torch.Tensor:
    """The weights of ``name`` that accelerate keeps off the model (a meta tensor on it), read
    where its hook reads them: the checkpoint, or the offload folder."""
    module_name, _, local = name.rpartition(".")
    module = model.get_submodule(module_name)
    while True:
        hook = getattr(module, "_hf_hook", None)
        weights = getattr(hook, "weights_map", None)
        if weights is not None:
            return weights[local]
        if not module_name:
            raise ModelLoadError(f"weight {name!r} is on the meta device and no accelerate hook holds it")
        module_name, _, parent = module_name.rpartition(".")
        local = f"{parent}.{local}"
        module = model.get_submodule(module_name)


def _gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check_device(where: object, what: str) -> None:
    if where in ("cpu", "disk"):
        return
    if where == "mps":
        if not torch.backends.mps.is_available():
            raise OptionError(f"{what}, but this machine has no MPS device; use 'cpu' or 'disk'")
        return
    index = where if isinstance(where, int) else int(str(where).partition(":")[2] or 0)
    count = _gpu_count()
    if index >= count:
        have = f"{count} CUDA GPU{'s' if count != 1 else ''}" + (f" (0 … {count - 1})" if count else "")
        raise OptionError(f"{what}, but this machine has {have}; name a device it has, 'cpu' or 'disk'")


def _check_modules(mapping: dict[str, Any], config: Any, *, trust_remote_code: bool) -> None:
    """Every module the map names exists in the model transformers builds (``AutoModel``: the base
    model's names, as ``enc.model.hf_device_map`` prints them), and every weight has a device."""
    from transformers import AutoModel

    with torch.device("meta"):
        skeleton = AutoModel.from_config(config, trust_remote_code=trust_remote_code)
    modules = dict(skeleton.named_modules())
    unknown = [name for name in mapping if name not in modules]
    if unknown:
        tops = [name for name in modules if name and "." not in name]
        raise OptionError(
            f"device_map names {unknown[:4]}, not modules of this {config.model_type} model; its modules "
            f"are named as in {', '.join(tops)} (layers as 'layers.0'…; enc.model.hf_device_map shows a map)"
        )
    for weight, _ in [*skeleton.named_parameters(), *skeleton.named_buffers()]:
        if not any(name == "" or weight == name or weight.startswith(f"{name}.") for name in mapping):
            raise OptionError(
                f"device_map gives no device to {weight.rsplit('.', 1)[0]!r}: name every module (or a "
                "parent of it), or use device_map='auto'"
            )


def _max_memory(text: str) -> dict[str | int, int]:
    caps = memory_caps(text)
    if isinstance(caps, dict):
        for device in caps:
            _check_device(device, f"max_device_memory caps {device!r}")
        return caps
    gpus = _gpu_count()
    return {i: caps for i in range(gpus)} if gpus else {"cpu": caps}  # the rest: the CPU, then disk


def _offload_folder(given: str | None) -> tuple[str, str | None]:
    """``(folder, the one made here)``: a given folder must be writable (made if missing: then it is
    this run's, removed with the model, as a temporary one is)."""
    if given is None:
        made = tempfile.mkdtemp(prefix="layerwise-offload-")
        return made, made
    folder = Path(given).expanduser()
    existed = folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise OptionError(
            f"offload_folder={given!r} cannot be written ({exc.strerror or exc}); pass a folder you can "
            "write to, with room for the weights the device map sends to 'disk'"
        ) from None
    return os.fspath(folder), None if existed else os.fspath(folder)  # one made here goes with the model


def _bitsandbytes(settings: Settings, device: torch.device, dtype: torch.dtype) -> Any:
    if device.type != "cuda":
        raise OptionError(
            f"quantize={settings.quantize!r} runs bitsandbytes' CUDA kernels, and this model's device is "
            f"{device}; use a CUDA GPU, or model_dtype='bfloat16' to halve the weights on the CPU, or "
            "streaming=True for a model larger than memory"
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise MissingDependencyError(
            f"quantize={settings.quantize!r} needs bitsandbytes: pip install 'layerwise[quantize]'"
        ) from None
    from transformers import BitsAndBytesConfig

    if settings.quantize == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype)
