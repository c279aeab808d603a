"""What an Encoder's outputs record of how they were made: the settings as a record says them, and
every output's metadata (``lw.read_meta`` reads it back), from the Settings whole and the engine's,
resolved: a new field of Settings is recorded with no edit here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .._features.plan import OutputPlan
from .._settings.settings import Settings
from .._version import __version__

if TYPE_CHECKING:
    from .._engine.engine import Engine
    from .._model.handle import ModelHandle


class Recorded(Protocol):
    """What the records read of an Encoder (core.py) or what loaded it (loading.py)."""

    settings: Settings
    source: str
    models: ModelHandle
    engine: Engine
    is_decoder: bool


def run_settings(loaded: Recorded) -> dict:
    """``loaded``'s settings as a record says them: ``final_norm`` is None for a model without one
    (an encoder without a final norm: final_norm.py)."""
    ran = loaded.settings.as_dict()
    ran["final_norm"] = ran["final_norm"] if loaded.models.takes_final_norm else None
    return ran


def run_meta(loaded: Recorded, settled: OutputPlan) -> dict:
    """How a run of the ``settled`` plan is made, for every output's metadata: layerwise's version,
    the settings under their Python names (``model`` is the name, ``model_source`` where it was
    loaded from; what ran resolved: ``device_used``, max_length, batch_size, max_tokens, streaming,
    stream_block_tokens, stream_residual, concurrent_forwards, packed, forward), the weights' hash,
    the plan."""
    from .._model.loading.weights_hash import weights_sha256

    engine, ran = loaded.engine, loaded.engine.settings
    settings = {
        **loaded.settings.as_dict(),
        "model_source": str(loaded.source),
        "device_used": ran.device,
        "max_length": ran.max_length,
        "batch_size": ran.batch_size,
        "max_tokens": ran.max_tokens,
        "streaming": ran.streaming,  # None decided by the model's size (_model/streaming/fits.py)
        "stream_block_tokens": ran.stream_block_tokens,
        # where a block's residual stream waits between layers: "device", or "host" (pinned)
        "stream_residual": engine.streamed.plan.residual if engine.streamed else None,
        "concurrent_forwards": engine.pool.forwards if engine.pool is not None else 1,
        "packed": engine.runner is not None,  # the packed forward, in memory or streamed
        "forward": engine.path,  # packed, streamed, or general: transformers' own forward
    }
    return {
        "layerwise_version": __version__,
        **settings,
        "weights_sha256": weights_sha256(loaded.models.current),
        "hidden_size": int(loaded.models.config.hidden_size),  # the config the load read
        "decoder": loaded.is_decoder,
        **settled.meta(int(loaded.models.config.num_hidden_layers) + 1),
    }
