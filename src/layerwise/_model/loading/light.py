"""The encoder's weights without transformers' modeling code, for the packed forward.

Importing a transformers model class costs more than loading the model: ``modeling_bert`` pulls in
torch._dynamo, torch.distributed.tensor (and sympy), FSDP and scipy.optimize, 1.7 s of a 4.6 s
start-up on the development machine, while this module loads all-MiniLM-L6-v2 in 0.01 s
(benchmarks/load_and_cast.py).
The packed forward (packed.py) needs none of that code: it calls the embeddings, the attention's
query/key/value and output, the intermediate and output modules. :class:`LightModel` is that
module tree under Hugging Face's own names (``embeddings.word_embeddings.weight``,
``encoder.layer.0.attention.self.query.weight``, …), read straight from ``model.safetensors``, and
each module's ``forward`` is the same sequence of torch ops as the Hugging Face module it stands
for (modeling_bert.py and its copies in transformers 5: BertEmbeddings, BertSelfOutput,
BertIntermediate, BertOutput), so the hidden states are the same numbers (tests: every layer,
every architecture, against the Hugging Face forward, and the same ``state_dict`` to the byte).

Only checkpoints that need nothing of Hugging Face's loading logic take this path: one
``model.safetensors`` holding every weight under the model's names (optionally behind the
architecture's base-model prefix such as ``bert.``; the unused pooler may be absent), an
absolute-position encoder of a type the packed forward runs, and an activation from
:data:`ACTIVATIONS`. Anything else (``pytorch_model.bin``, sharded or renamed weights, a missing or
misshapen weight) returns None, and the caller loads the transformers model as before, with its strict
checks and error messages. The transformers model is still built when something needs it
(``Encoder.model``, hooks, taps, ``packed=False``): see handle.py.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..families.table import family
from ..forward.packed import unpackable
from .weights_checks import unused_weights

logger = logging.getLogger("layerwise")

# The base-model prefix under which a checkpoint with a head (BertForMaskedLM, …) holds the encoder.
_PREFIX = {
    "bert": "bert.",
    "roberta": "roberta.",
    "xlm-roberta": "roberta.",
    "camembert": "roberta.",
    "electra": "electra.",
}
_NO_POOLER = ("electra",)  # AutoModel of these has no pooler


def _gelu_new(x: torch.Tensor) -> torch.Tensor:  # transformers' NewGELUActivation, op for op
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _gelu_fast(x: torch.Tensor) -> torch.Tensor:  # transformers' FastGELUActivation, op for op
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


# config.hidden_act -> the function transformers' ACT2FN applies (activations.py); others: None
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": _gelu_new,
    "gelu_fast": _gelu_fast,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


def _meta(*shape: int) -> nn.Parameter:
    """A parameter with a shape and no storage, filled by ``load_state_dict(assign=True)``. (torch's
    own layers initialise their weights even on the meta device, and that imports torch._dynamo: 1 s)"""
    return nn.Parameter(torch.empty(shape, device="meta"), requires_grad=False)


class Linear(nn.Module):  # nn.Linear's forward
    def __init__(self, width_in: int, width_out: int) -> None:
        super().__init__()
        self.weight, self.bias = _meta(width_out, width_in), _meta(width_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class LayerNorm(nn.Module):  # nn.LayerNorm's forward
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = _meta(width), _meta(width), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class Embedding(nn.Module):  # nn.Embedding's forward
    def __init__(self, n: int, width: int) -> None:
        super().__init__()
        self.weight = _meta(n, width)
        self.padding_idx: int | None = None  # a position table's reserved row (_model/positions.py)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LightEmbeddings(nn.Module):
    def __init__(self, config: Any, width: int) -> None:
        super().__init__()
        self.word_embeddings = Embedding(config.vocab_size, width)
        self.position_embeddings = Embedding(config.max_position_embeddings, width)
        self.token_type_embeddings = Embedding(config.type_vocab_size, width)
        self.LayerNorm = LayerNorm(width, config.layer_norm_eps)
        row = family(config.model_type)  # as transformers' class: positions after that row
        if row is not None and row.positions == "learned after a padding row":
            self.position_embeddings.padding_idx = config.pad_token_id

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor):
        embeddings = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        embeddings = embeddings + self.position_embeddings(position_ids)
        return self.LayerNorm(embeddings)


class LightSelfAttention(nn.Module):  # weights only: packed.py fuses them and runs the attention
    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.query = Linear(hidden, hidden)
        self.key = Linear(hidden, hidden)
        self.value = Linear(hidden, hidden)
        self.scaling = (hidden // config.num_attention_heads) ** -0.5


class LightResidualOutput(nn.Module):
    """BertSelfOutput and BertOutput: dense, then LayerNorm of it plus the block's input."""

    def __init__(self, config: Any, width_in: int) -> None:
        super().__init__()
        self.dense = Linear(width_in, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(hidden_states) + input_tensor)


class LightIntermediate(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACTIVATIONS[config.hidden_act]  # transformers' name

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


class LightAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.self = LightSelfAttention(config)
        self.output = LightResidualOutput(config, config.hidden_size)


class LightLayer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.attention = LightAttention(config)
        self.intermediate = LightIntermediate(config)
        self.output = LightResidualOutput(config, config.intermediate_size)


class LightEncoder(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.layer = nn.ModuleList(LightLayer(config) for _ in range(config.num_hidden_layers))


class LightPooler(nn.Module):  # never run: held so that the state_dict (and its hash) is the model's
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)


class LightModel(nn.Module):
    """The modules of a BERT-family encoder that the packed forward calls, under Hugging Face's
    names; built on the meta device (no random initialisation) and filled from the checkpoint."""

    def __init__(self, config: Any, *, pooler: bool) -> None:
        super().__init__()
        self.config = config
        width = getattr(config, "embedding_size", None) or config.hidden_size  # ELECTRA: smaller
        self.embeddings = LightEmbeddings(config, width)
        if width != config.hidden_size:
            self.embeddings_project = Linear(width, config.hidden_size)
        self.encoder = LightEncoder(config)
        if pooler:
            self.pooler = LightPooler(config)


def light_unsupported(config: Any) -> str | None:
    """Why the packed forward cannot run ``config`` on a LightModel, or None when it can."""
    reason = unpackable(config)
    if reason:
        return reason
    if getattr(config, "add_cross_attention", False):  # weights a LightModel does not hold
        return "cross-attention"
    if not isinstance(config.hidden_act, str) or config.hidden_act not in ACTIVATIONS:
        return f"activation {config.hidden_act!r}"
    if config.hidden_size % config.num_attention_heads:
        return "hidden size not a multiple of the heads"
    return None


def weights_file(source: str) -> Path | None:
    """``model.safetensors`` of a local folder, or of a hub model in the local cache; None if absent."""
    folder = Path(source)
    if folder.is_dir():
        path = folder / "model.safetensors"
        return path if path.is_file() else None
    try:
        from transformers.utils import cached_file

        from .hub import hub_kwargs

        found = cached_file(
            source, "model.safetensors", _raise_exceptions_for_missing_entries=False, **hub_kwargs(source)
        )
    except Exception:  # not cached, offline, gated: the transformers loader says why
        return None
    return Path(found) if found else None


def base_prefix(config: Any, stored: set[str]) -> str | None:
    """The prefix under which ``stored`` (a checkpoint's names) holds every weight of the encoder: ""
    or the architecture's base-model prefix (``bert.``); None when neither holds them all."""
    wanted = LightModel(config, pooler=False).state_dict(keep_vars=True)  # name -> meta parameter
    return next((p for p in ("", _PREFIX[config.model_type]) if all(p + k in stored for k in wanted)), None)


def load_light_model(source: str, config: Any, dtype: torch.dtype) -> LightModel | None:
    """The checkpoint of ``source`` as a :class:`LightModel` in ``dtype`` (as ``from_pretrained``
    casts it), or None when only the transformers loader can load it (see the module docstring)."""
    reason = light_unsupported(config)
    path = None if reason else weights_file(source)
    if path is None:
        logger.debug("loading %s with transformers: %s", source, reason or "no model.safetensors")
        return None
    try:
        return _read(path, config, dtype, source)
    except Exception as exc:  # a damaged or unreadable file: the transformers loader's error names it
        logger.debug("loading %s with transformers: %s", source, exc)
        return None


def _read(path: Path, config: Any, dtype: torch.dtype, source: str) -> LightModel | None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        stored = set(handle.keys())
        # a checkpoint without the (unused) pooler, e.g. of a masked-LM model, loads without it, as
        # load_model allows; weights_sha256 leaves the transformers model's random pooler out
        prefix = base_prefix(config, stored)
        if prefix is None:
            wanted = LightModel(config, pooler=False).state_dict(keep_vars=True)
            missing = sorted(k for k in wanted if k not in stored)[:3]
            logger.debug("loading %s with transformers: weights named otherwise: %s", source, missing)
            return None
        pooler = config.model_type not in _NO_POOLER and f"{prefix}pooler.dense.weight" in stored
        model = LightModel(config, pooler=pooler)
        state = {}
        for name, meta in model.state_dict(keep_vars=True).items():
            if prefix + name not in stored:  # a pooler with its weight but not its bias
                logger.debug("loading %s with transformers: no %s", source, prefix + name)
                return None
            tensor = handle.get_tensor(prefix + name)
            if tensor.shape != meta.shape:  # the transformers loader's error names it
                logger.debug("loading %s with transformers: %s is %s", source, name, tuple(tensor.shape))
                return None
            # a weight stored as integers (an int32 bias) is cast as transformers casts it
            state[name] = tensor.to(dtype) if meta.is_floating_point() else tensor
        used = set(model.state_dict())
        leftover = [k for k in stored if not (k.startswith(prefix) and k[len(prefix) :] in used)]
    if unused_weights(sorted(leftover), used, prefix):  # the transformers loader's error names them
        logger.debug("loading %s with transformers: weights the config does not use", source)
        return None
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()
