"""The logit lens: each layer's hidden state read through the model's own output head, as if that
layer were the last.

- **Encoders**, at each ``[MASK]`` of the text, through the masked-LM head of the checkpoint
  (``cls.predictions`` for BERT and ``layerwise pretrain`` models, ``lm_head`` for RoBERTa/MPNet,
  ``vocab_*`` for DistilBERT, ``generator_*`` for ELECTRA generators). A checkpoint without one
  (sentence-transformers models such as all-MiniLM-L6-v2) has no lens: :meth:`MaskedLMHead.load`
  returns None rather than a randomly initialised head.
- **Decoder LMs**, at the last token (the next token's prediction), through the model's own final
  norm and ``lm_head`` (tied to the embeddings or not; Gemma 2's logit soft-capping included), so
  that at the last layer the lens gives exactly the model's own logits (:class:`CausalLMHead`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._engine.call import Call
from .._inputs.display import token_display
from .._model.final_norm import final_norm_module
from ..errors import InputError

if TYPE_CHECKING:
    from .._encoder import Encoder
    from .._results import LayerStack

logger = logging.getLogger("layerwise")


@dataclass(eq=False)
class MaskedLMHead:
    """The masked-LM head of ``encoder``'s checkpoint: hidden states -> vocabulary logits."""

    apply: Callable  # torch (n, hidden) -> (n, vocab)
    mask_token: str
    vocabulary: list[str]
    device: Any = "cpu"
    inputs: Any = None  # an InputEncoder that reads "[MASK]" in a text as the mask token
    shown_by: Callable[[str], str] = str  # a piece as a person reads it (_inputs/display.py)

    @classmethod
    def load(cls, encoder: Encoder) -> MaskedLMHead | None:
        """The head saved with ``encoder``'s checkpoint, or None when it has none (or the tokenizer
        has no mask token)."""
        import torch
        from transformers import AutoModelForMaskedLM

        from .._model.loading.source import quiet_transformers

        tokenizer = encoder.tokenizer
        if tokenizer.mask_token is None:
            return None
        try:
            with quiet_transformers():
                mlm, info = AutoModelForMaskedLM.from_pretrained(
                    encoder.source,
                    dtype=torch.float32,
                    output_loading_info=True,
                    trust_remote_code=encoder.settings.trust_remote_code,  # the model's own code, as asked
                )
        except Exception as exc:  # no masked-LM class for this config, or no weights for it
            logger.debug("no masked-LM head for %s: %s", encoder.name, exc)
            return None
        head = _head_function(mlm)
        missing = [k for k in info.get("missing_keys", ()) if not k.endswith("decoder.bias")]
        if head is None or any(_is_head_key(k) for k in missing):
            return None  # the head would be random weights: no lens rather than a wrong one
        mlm.to(encoder.device).eval()
        vocabulary = tokenizer.convert_ids_to_tokens(list(range(mlm.config.vocab_size)))
        from .._inputs.encoding import InputEncoder

        inputs = InputEncoder(
            tokenizer.backend_tokenizer,
            encoder.max_length,
            special_tokens_in_text=True,
            vocab_size=encoder.inputs.vocab_size,
        )
        return cls(
            head,
            tokenizer.mask_token,
            [str(t) for t in vocabulary],
            encoder.device,
            inputs,
            shown_by=token_display(tokenizer),
        )

    def logits(self, hidden: np.ndarray, layers: tuple[int, ...] = ()) -> np.ndarray:
        """``(n, hidden_size)`` -> ``(n, vocab_size)`` float32 (``layers``: unused here)."""
        import torch

        with torch.inference_mode():
            x = torch.as_tensor(np.ascontiguousarray(hidden, dtype=np.float32)).to(self.device)
            return self.apply(x).float().cpu().numpy()


@dataclass(eq=False)
class CausalLMHead:
    """A decoder LM's final norm and ``lm_head``: hidden states -> next-token logits."""

    norm: Callable  # torch (n, hidden) -> (n, hidden)
    head: Callable  # torch (n, hidden) -> (n, vocab), soft-capped where the model caps
    vocabulary: list[str]
    device: Any = "cpu"
    mask_token: None = None
    inputs: Any = None
    shown_by: Callable[[str], str] = str  # a piece as a person reads it (_inputs/display.py)

    @classmethod
    def load(cls, encoder: Encoder) -> CausalLMHead | None:
        """The causal-LM head of ``encoder``'s checkpoint, or None when its weights are not there.

        The final norm is the encoder's own module. A head tied to the token embeddings (SmolLM2,
        Qwen2, Gemma) is those embeddings: nothing is loaded. An untied one is read from the
        checkpoint with its causal-LM class, and only ``lm_head`` is kept."""
        import torch

        model = encoder.model
        norm = final_norm_module(model)
        if norm is None:
            return None
        config = model.config
        if getattr(config, "tie_word_embeddings", False):
            weight = model.get_input_embeddings().weight
            lm_head: Callable = lambda h: torch.nn.functional.linear(h, weight)  # noqa: E731
        else:
            lm_head = _untied_lm_head(encoder)
            if lm_head is None:
                return None
        cap = getattr(config, "final_logit_softcapping", None)
        scale = _logit_scale(config)

        def head(h: Any) -> Any:
            logits = lm_head(h) * scale if scale != 1.0 else lm_head(h)
            return torch.tanh(logits / cap) * cap if cap else logits

        vocabulary = encoder.tokenizer.convert_ids_to_tokens(list(range(config.vocab_size)))
        return cls(
            norm,
            head,
            [str(t) for t in vocabulary],
            encoder.device,
            None,
            encoder.inputs,
            shown_by=token_display(encoder.tokenizer),
        )

    def logits(self, hidden: np.ndarray, layers: tuple[int, ...] = ()) -> np.ndarray:
        """``(n, hidden_size)`` raw residual stream at hidden states ``layers`` -> ``(n, vocab_size)``
        float32: the final norm, then the head (the lens reads every state raw: final_norm=False)."""
        import torch

        with torch.inference_mode():
            x = torch.as_tensor(np.ascontiguousarray(hidden, dtype=np.float32)).to(self.device)
            return self.head(self.norm(x)).float().cpu().numpy()


def _logit_scale(config: Any) -> float:
    """What the causal-LM class multiplies its logits by, as transformers' own forward does: Cohere's
    ``logit_scale``, Granite's ``1 / logits_scaling``, ``output_multiplier`` (before any soft cap)."""
    scale = float(getattr(config, "logit_scale", None) or 1.0)
    scale /= float(getattr(config, "logits_scaling", None) or 1.0)
    return scale * float(getattr(config, "output_multiplier", None) or 1.0)


def _untied_lm_head(encoder: Encoder) -> Any:
    """``lm_head`` of ``encoder``'s checkpoint (the rest of the causal-LM copy is let go), or None
    when the checkpoint has no such weights: no lens rather than one through random weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from .._model.loading.gguf_files import loader_args
    from .._model.loading.source import quiet_transformers

    where, extra = loader_args(encoder.source)
    try:
        with quiet_transformers(gguf="gguf_file" in extra):
            loaded: Any = AutoModelForCausalLM.from_pretrained(
                where,
                dtype=torch.float32,
                output_loading_info=True,
                trust_remote_code=encoder.settings.trust_remote_code,  # the model's own code, as asked
                **extra,
            )
        lm, info = loaded
    except Exception as exc:
        logger.debug("no causal-LM head for %s: %s", encoder.name, exc)
        return None
    if any(k.startswith("lm_head") for k in info.get("missing_keys", ())):
        return None
    return lm.get_output_embeddings().to(encoder.device).eval()


def load_lens_head(encoder: Encoder) -> MaskedLMHead | CausalLMHead | None:
    """The head the logit lens reads ``encoder``'s layers through, or None when it has none."""
    return CausalLMHead.load(encoder) if encoder.is_decoder else MaskedLMHead.load(encoder)


def logit_lens(
    encoder: Encoder, text: str, *, k: int = 5, head: MaskedLMHead | CausalLMHead | None = None
) -> dict:
    """Per hidden state, the ``k`` most likely tokens through the model's own head: for an encoder
    at each ``[MASK]`` in ``text`` (InputError when there is none), for a decoder LM at the last
    token (its next token). ``{"kind": "mask" | "next_token", "tokens", "layers", "masks":
    [{"position", "predictions": [[(token, p)…] per layer], "pieces": [[piece…] per layer]}]}``:
    tokens as a person reads them (``" Paris"``, not ``"ĠParis"``: _inputs/display.py), their raw
    vocabulary pieces in ``pieces``."""
    head = head if head is not None else load_lens_head(encoder)
    if head is None:
        what = "causal-LM head (lm_head)" if encoder.is_decoder else "masked-LM head"
        raise InputError(f"model {encoder.name!r} has no {what} in its checkpoint: no logit lens")
    stack = _extract_with_masks(encoder, head, text)
    if isinstance(head, CausalLMHead):
        positions, kind = [stack.n_tokens - 1], "next_token"
    else:
        positions = [t for t, token in enumerate(stack.tokens) if token == head.mask_token]
        kind = "mask"
        if not positions:
            raise InputError(f"put {head.mask_token} in the text to see each layer's predictions for it")
    k = max(1, min(int(k), len(head.vocabulary)))
    masks = []
    shown = head.shown_by
    for position in positions:
        logits = head.logits(stack.hidden[:, position], stack.layers)  # (n_layers, vocab)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        probs = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
        per_layer, pieces = [], []
        for row in probs:
            top = np.argsort(-row, kind="stable")[:k]
            per_layer.append([(shown(head.vocabulary[i]), float(row[i])) for i in top])
            pieces.append([head.vocabulary[i] for i in top])
        masks.append({"position": position, "predictions": per_layer, "pieces": pieces})
    return {
        "kind": kind,
        "tokens": [shown(t) for t in stack.tokens],
        "pieces": list(stack.tokens),
        "layers": list(stack.layers),
        "masks": masks,
    }


def _extract_with_masks(encoder: Encoder, head: MaskedLMHead | CausalLMHead, text: str) -> LayerStack:
    """``encoder.extract(text, layers="all")``, except that "[MASK]" in the text is the mask
    token (extract reads special-token strings typed in a text as plain text)."""
    from .._inputs.raw import normalize_inputs
    from .._inputs.reports import report_blocks

    block = head.inputs.encode_block(normalize_inputs([text]))
    report_blocks([block], 1, encoder.max_length)
    encoded = block.items()
    layers = tuple(range(encoder.n_hidden_states))
    call = Call(layers, "hidden_states", final_norm=False)  # raw: CausalLMHead norms every state once
    stream = encoder.engine.run_inputs(encoded, call, progress=False)
    return dict(stream)[0]


# ---------------------------------------------------------------------------------------------- heads
_HEAD_PREFIXES = ("cls.predictions.", "lm_head.", "vocab_", "generator_predictions.", "generator_lm_head.")


def _is_head_key(key: str) -> bool:
    return key.startswith(_HEAD_PREFIXES)


def _head_function(mlm) -> Callable | None:
    """The part of a *ForMaskedLM model that maps the last hidden state to logits."""
    kind = mlm.config.model_type
    if kind == "bert":
        return mlm.cls
    if kind in ("roberta", "xlm-roberta", "camembert", "mpnet"):
        return mlm.lm_head
    if kind == "distilbert":
        return lambda h: mlm.vocab_projector(mlm.vocab_layer_norm(mlm.activation(mlm.vocab_transform(h))))
    if kind == "electra":
        return lambda h: mlm.generator_lm_head(mlm.generator_predictions(h))
    return None
