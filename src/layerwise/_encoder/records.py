"""What an Encoder's outputs record of how they were made: the settings as a record says them, and
every output's metadata (``lw.read_meta`` reads it back)."""

from __future__ import annotations

from typing import Any

from .._features.plan import OutputPlan
from .._settings.settings import Settings
from .._version import __version__


class RunRecords:
    """``run_settings`` and ``run_meta`` of the Encoder (core.py), from its Settings whole and the
    engine's, resolved: a new field of Settings is recorded with no edit here."""

    settings: Settings
    engine: Any
    models: Any
    source: str
    is_decoder: bool
    hidden_size: int

    # the Encoder's own (core.py)
    @property
    def n_hidden_states(self) -> int:
        raise NotImplementedError

    def settle(self, plan: OutputPlan) -> OutputPlan:
        raise NotImplementedError

    def run_settings(self) -> dict:
        """These settings as a record says them: an encoder's ``final_norm`` is None (it has none)."""
        ran = self.settings.as_dict()
        ran["final_norm"] = ran["final_norm"] if self.is_decoder else None
        return ran

    def run_meta(self, plan: OutputPlan) -> dict:
        """How a run of ``plan`` is made, for every output's metadata: layerwise's version, these
        settings under their Python names (``model`` is the name, ``model_source`` where it was
        loaded from; what ran resolved: ``device_used``, max_length, batch_size, max_tokens,
        streaming, stream_block_tokens, stream_residual, streams, packed), the weights' hash, the
        settled plan."""
        from .._model.loading.source import weights_sha256

        settled = self.settle(plan)
        ran = self.engine.settings
        settings = {
            **self.settings.as_dict(),
            "model_source": str(self.source),
            "device_used": ran.device,
            "max_length": ran.max_length,
            "batch_size": ran.batch_size,
            "max_tokens": ran.max_tokens,
            "streaming": ran.streaming,  # None decided by the model's size (_model/streaming/fits.py)
            "stream_block_tokens": ran.stream_block_tokens,
            # where a block's residual stream waits between layers: "device", or "host" (pinned)
            "stream_residual": self.engine.streamed.plan.residual if self.engine.streamed else None,
            "streams": self.engine.pool.streams if self.engine.pool is not None else 1,
            "packed": self.engine.runner is not None,  # the packed forward, in memory or streamed
        }
        return {
            "layerwise_version": __version__,
            **settings,
            "weights_sha256": weights_sha256(self.models.current),
            "hidden_size": self.hidden_size,
            "decoder": self.is_decoder,
            **settled.meta(self.n_hidden_states),
        }
