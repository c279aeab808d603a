"""The encoder's model, built only as far as the work needs.

The packed forward runs on a :class:`~layerwise._model.loading.light.LightModel` read straight from the
checkpoint, which skips importing transformers' modeling code (1.5-2 s of start-up). The
transformers model is built the first time something needs it: ``Encoder.model``, forward hooks,
sub-layer taps, ``packed=False``. From then on the packed forward runs on the transformers model's
own modules (the listeners move it there), so weights a user edits through ``Encoder.model`` are
the weights every path uses, and the light copy is dropped.
"""

from __future__ import annotations

import errno
import shutil
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ModelLoadError, OptionError
from .families.kinds import is_decoder_config
from .final_norm import check_final_norm_honoured, verdict
from .loading.light import load_light_model
from .loading.placement import Placement, input_device
from .loading.source import load_model

if TYPE_CHECKING:
    from .streaming.model import StreamedModel


class ModelHandle:
    """One model of one encoder: ``current`` is what the packed forward runs on (the light model
    until the transformers model exists, then that), ``transformers()`` builds the latter once."""

    def __init__(
        self,
        source: str,
        name: str,
        config: Any,
        dtype: torch.dtype,
        device: torch.device,
        *,
        light: bool,
        streaming: bool = False,
        placement: Placement | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        self.source, self.name, self.config = source, name, config
        self.dtype, self.device = dtype, device  # a placed model: the device its inputs go to
        self.placement = placement  # accelerate's device map or quantisation (placement.py)
        self.trust_remote_code = trust_remote_code  # the model's own code (auto_map): asked for
        self._lock = threading.Lock()
        self._listeners: list[Callable[[Any], None]] = []
        self._hf: Any = None
        # a layer-streamed model (streaming/model.py): its weights stay in the checkpoint
        self.streamed: StreamedModel | None = None
        if streaming:
            from .streaming.load import load_streamed

            self.streamed, self._light = load_streamed(source, name, config, dtype, device), None
            return
        self._light = load_light_model(source, config, dtype) if light and placement is None else None
        if self._light is None:
            self._hf = self._load()
        else:
            self._light.to(device)

    @property
    def built(self) -> bool:
        """Whether the transformers model exists (else the packed forward runs on the light model)."""
        return self._hf is not None

    @property
    def current(self) -> Any:
        """The module tree the packed forward runs on, and whose weights are hashed: both have
        Hugging Face's parameter names and the same tensors."""
        if self._hf is not None:
            return self._hf
        return self.streamed.skeleton if self.streamed is not None else self._light

    @property
    def described(self) -> str:
        """The model as messages name it: ``'t5-small' (a 't5' model)``."""
        return f"{self.name!r} (a {self.config.model_type!r} model)"

    @property
    def takes_final_norm(self) -> bool:
        """Whether ``final_norm`` is an option of this model: a decoder's, or an encoder's whose final
        norm can be separated (T5's, ModernBERT's, mBART's; final_norm.py). Its records say it."""
        return is_decoder_config(self.config) or verdict(self.current) == "module"

    def check_final_norm(self, value: Any) -> None:
        """Refuse, naming this model and why, a ``final_norm`` it cannot honour (final_norm.py)."""
        check_final_norm_honoured(self.current, value, self.described)

    def transformers(self) -> Any:
        """The transformers model (``AutoModel``), built on the first call; listeners hear of it."""
        if self._hf is not None:
            return self._hf
        if self.streamed is not None:
            raise OptionError(
                f"model {self.name!r} is streamed (streaming=True): its weights are never whole in memory, "
                "and this needs the transformers model (Encoder.model, method='hooks', sub-layer taps, "
                "packed=False). Load it in memory (streaming=False) for that"
            )
        with self._lock:
            if self._hf is None:
                model = self._load()
                for listener in self._listeners:
                    listener(model)
                self._hf, self._light = model, None
        return self._hf

    def on_transformers(self, listener: Callable[[Any], None]) -> None:
        """Call ``listener(model)`` when the transformers model is built (before anyone else sees it)."""
        self._listeners.append(listener)

    def _load(self) -> Any:
        remote = self.trust_remote_code
        if self.placement is None:
            model = load_model(self.source, self.name, self.dtype, self.config, trust_remote_code=remote)
            return model.to(self.device).eval()
        try:
            model = load_model(
                self.source,
                self.name,
                self.dtype,
                self.config,
                self.placement.kwargs,
                trust_remote_code=remote,
            )
        except BaseException as exc:
            self.placement.discard()
            folder = self.placement.kwargs.get("offload_folder")
            cause: BaseException | None = exc  # load_model wraps what transformers raised
            while cause is not None and not (isinstance(cause, OSError) and cause.errno == errno.ENOSPC):
                cause = cause.__cause__
            if cause is not None and folder:
                free = shutil.disk_usage(folder).free
                raise ModelLoadError(
                    f"the disk-offload folder {folder!r} filled up ({free:,} bytes free) while the device "
                    "map sent weights there; pass an offload_folder on a disk with room for them, or give "
                    "the devices more memory (max_device_memory)"
                ) from None
            raise
        self.placement.adopt(model)
        self.device = input_device(model)
        return model.eval()
