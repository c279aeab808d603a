"""An Encoder's model, loaded from one Settings: where it comes from, its tokenizer, whether it
streams (layer by layer), where accelerate places it, and the engine that runs it, with every
setting the Encoder left open (device, max_length, batch_size, max_tokens, a streamed model's block
plan) resolved for this model and device. core.py's Encoder is made of what :func:`load` returns."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from .._engine.engine import Engine
from .._host.cpu import cpu_flags, cpu_name, matrix_units
from .._host.memory import available_memory
from .._inputs.encoding import InputEncoder
from .._model.families.kinds import is_decoder_config
from .._model.forward.concurrent import check_forwards
from .._model.handle import ModelHandle
from .._model.loading.gguf_files import gguf_read_once
from .._model.loading.placement import placement_of
from .._model.loading.sentence_transformers import read_sentence_transformers
from .._model.loading.source import (
    load_config_and_tokenizer,
    pick_device,
    resolve_model_source,
    usable_max_length,
)
from .._model.positions import first_position
from .._model.streaming.fits import resolve_streaming
from .._model.streaming.plan import StreamPlan, plan_stream
from .._settings.settings import Settings

CPU_MAX_TOKENS = 2048
GPU_MAX_TOKENS = 32768
# inputs per batch: on a GPU 128 short sentences (~3,500 tokens) leave an H100 idle; 1024 with the
# token budget ran embed 1.4x and extract 1.5x faster on one (benchmarks/gpu_profile.py)
CPU_BATCH_SIZE, GPU_BATCH_SIZE = 128, 1024
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
logger = logging.getLogger("layerwise")


@dataclass(frozen=True)
class Loaded:
    """A model ready to extract: ``settings`` as given (the model by its name, which any process
    resolves to the same files; ``source``: where they were found), its config and fast
    tokenizer, the model (``models``), the inputs' encoder, the engine (whose settings are these
    resolved: what runs), the folder's sentence-transformers convention, and whether it is a
    decoder LM."""

    settings: Settings
    source: str
    name: str
    config: Any
    tokenizer: Any
    models: ModelHandle
    inputs: InputEncoder
    engine: Engine
    sentence_transformers: Any
    is_decoder: bool


def load(given: Settings) -> Loaded:
    """The model ``given`` names, loaded as it says (light when packed, streamed when asked or too
    large to hold, placed by accelerate for a device map or quantised weights)."""
    source, name = resolve_model_source(given.model)
    device = pick_device(given.device)
    warn_slow_dtype(given.model_dtype, device)
    dtype = TORCH_DTYPES[given.model_dtype]  # light=packed: the packed forward needs no HF class
    with gguf_read_once(source):
        # the fast tokenizer; a model's own code runs only when the settings say so
        config, tokenizer = load_config_and_tokenizer(source, name, trust_remote_code=given.trust_remote_code)
        # streaming=None: streamed when the weights do not fit in the device's free memory
        streaming = resolve_streaming(given, source, config, dtype, device, name)
        placement = placement_of(given, config, device, dtype, source)  # a device map, quantised weights
        models = ModelHandle(
            source,
            name,
            config,
            dtype,
            device,
            light=given.packed,
            streaming=streaming,
            placement=placement,
            trust_remote_code=given.trust_remote_code,
        )
    device = models.device  # a placed model's: where its inputs go
    is_decoder = is_decoder_config(config)
    sentence_transformers = read_sentence_transformers(source)
    convention = sentence_transformers.max_seq_length if sentence_transformers else None
    first = first_position(models.current)  # positions after a padding row: fewer than the table
    max_length = usable_max_length(config, tokenizer, given.max_length, convention, first)
    vocab = int(config.vocab_size)  # token ids past it are refused at encode time
    inputs = InputEncoder(tokenizer.backend_tokenizer, max_length, vocab_size=vocab, pairs=not is_decoder)
    settings = given.replace(model=name)  # streaming: as given (None: decided by size)
    on_cpu = device.type == "cpu"
    max_tokens = given.max_tokens or (CPU_MAX_TOKENS if on_cpu else GPU_MAX_TOKENS)
    forwards = check_forwards(given.concurrent_forwards, device, int(config.hidden_size))  # batches at once
    plan = _stream_plan(given, models, device, max_length, max_tokens, forwards)
    resolved = settings.replace(
        device=str(device),
        max_length=max_length,
        batch_size=given.batch_size or (CPU_BATCH_SIZE if on_cpu else GPU_BATCH_SIZE),
        max_tokens=max_tokens if plan is None else plan.batch_tokens,
        # a tight streaming budget: one at a time
        concurrent_forwards=given.concurrent_forwards if plan is None else plan.forwards,
        packed=given.packed and placement is None,  # accelerate's hooks run in transformers' forward
        stream_block_tokens=None if plan is None else plan.block_tokens,
        streaming=streaming,
    )
    engine = Engine(models, tokenizer, resolved, plan)  # the model's final norm settled (warm-up)
    models.check_final_norm(given.final_norm)
    return Loaded(
        settings, source, name, config, tokenizer, models, inputs, engine, sentence_transformers, is_decoder
    )


def warn_slow_dtype(model_dtype: str, device: torch.device) -> None:
    """A half-precision model on a CPU without matrix units for its dtype runs its matrix products
    element by element, several times slower than float32 (benchmarks/cpu_bf16.py): said at load,
    with the fix. The run goes on: halving the weights' memory may be why it was asked for."""
    if device.type != "cpu" or model_dtype == "float32" or matrix_units(model_dtype) is not None:
        return
    if not cpu_flags():  # no /proc/cpuinfo (macOS, Windows): the units cannot be told, nothing said
        return
    units = "AMX or AVX-512 BF16" if model_dtype == "bfloat16" else "AMX-FP16 or AVX-512 FP16"
    logger.warning(
        "model_dtype=%r: this CPU (%s) has no %s matrix units, so the model's matrix products run "
        "several times slower than in float32. Leave model_dtype='float32' (the default) for speed; %s "
        "pays on a CPU with %s (layerwise info says what this one has)",
        model_dtype,
        cpu_name(),
        model_dtype,
        model_dtype,
        units,
    )


def _stream_plan(
    given: Settings,
    models: ModelHandle,
    device: torch.device,
    max_length: int,
    max_tokens: int,
    forwards: int,
) -> StreamPlan | None:
    """How a streamed model's blocks run, settled before its forward is built; None when the model
    is in memory."""
    if models.streamed is None:
        return None
    return plan_stream(
        given,
        models.streamed.shape(),
        on_cuda=device.type == "cuda",
        host_free=available_memory(),
        max_length=max_length,
        max_tokens=max_tokens,
        forwards=forwards,
    )
