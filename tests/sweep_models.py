"""Every text model type transformers has a masked-LM, causal-LM or sequence-to-sequence head for,
built tiny and random from its config class with generic small settings, saved with a tokenizer of
ours: the sweep (tests/test_sweep.py, benchmarks/hostile_families.py) loads each with layerwise and
compares it with transformers' own ``output_hidden_states``.

A type whose config class or model transformers cannot build with these settings (a required field
without a default, a size that must divide another, a model over :data:`MAX_PARAMETERS` because some
size is not one of the generic fields) is skipped, and the sweep says how many.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from any_models import save_with_norms_moved

HEADS = {
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "masked": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "causal": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
}
# generic small settings: each set where the config class has the field (under its own name or an alias)
SMALL: dict[str, Any] = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
    max_position_embeddings=128, head_dim=8, embedding_size=32, d_model=32, d_ff=64, d_kv=8, num_layers=2,
    num_heads=4, num_decoder_layers=2, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, ffn_dim=64, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, num_experts=4, num_local_experts=4, n_routed_experts=4,
    num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16,
    qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, word_embed_proj_dim=32, n_positions=128,
    rotary_dim=4, max_seq_len=128, seq_length=128, type_vocab_size=2,
)  # fmt: skip
MAX_PARAMETERS = 4_000_000
# the state-space and hybrid types whose configs hold sizes of their own, which must divide each
# other or list the layers: small values that agree, so that they are swept rather than skipped
SSM_SMALL: dict[str, dict[str, Any]] = {
    "mamba2": dict(num_heads=8, head_dim=8, n_groups=1, state_size=16, expand=2),
    "bamba": dict(mamba_n_heads=8, mamba_d_head=8, mamba_d_state=16, attn_layer_indices=[1]),
    "granitemoehybrid": dict(
        mamba_n_heads=8, mamba_d_head=8, mamba_d_state=16, layer_types=["linear_attention", "attention"]
    ),
    "zamba": dict(
        mamba_d_state=16,
        layer_types=["linear_attention", "hybrid"],
        attn_layer_period=2,
        attn_layer_offset=1,
        head_dim=8,
    ),
    "zamba2": dict(
        mamba_headdim=8,
        mamba_d_state=16,
        layer_types=["linear_attention", "hybrid"],
        hybrid_layer_ids=[1],
        head_dim=8,
    ),
}


def type_head(model_type: str) -> str | None:
    """The head a type is built with: seq2seq before masked before causal (BART has all three)."""
    from transformers.models.auto import modeling_auto

    for head, mapping in HEADS.items():
        if model_type in getattr(modeling_auto, mapping):
            return head
    return None


def swept_types() -> list[str]:
    """The types of transformers' masked-LM, causal-LM and seq2seq mappings, sorted."""
    from transformers.models.auto import modeling_auto

    return sorted({t for m in HEADS.values() for t in getattr(modeling_auto, m)})


def tokenizer_for(head: str):
    from tokenizer_kinds import byte_level

    return byte_level("neox" if head == "causal" else "bart")


class Unbuildable(Exception):
    """transformers cannot build this type with the generic settings (a skip, never a failure)."""


def small_config(model_type: str, tokenizer: Any) -> Any:
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    try:
        defaults = config_class()
    except Exception as exc:
        raise Unbuildable(f"its config class has no defaults: {type(exc).__name__}: {exc}") from exc
    aliases = getattr(config_class, "attribute_map", {})
    given = {aliases.get(k, k): v for k, v in SMALL.items() if _settable(defaults, k)}
    if _settable(defaults, "kv_lora_rank"):  # multi-head latent attention: as many key heads as queries
        given[aliases.get("num_key_value_heads", "num_key_value_heads")] = SMALL["num_attention_heads"]
    given["vocab_size"] = len(tokenizer)
    given.update(SSM_SMALL.get(model_type, {}))
    for special in ("pad", "bos", "eos", "cls", "sep", "mask", "decoder_start"):
        token_id = getattr(tokenizer, f"{special}_token_id", None)
        if special == "decoder_start":
            token_id = tokenizer.pad_token_id
        if token_id is not None and hasattr(defaults, f"{special}_token_id"):
            given[f"{special}_token_id"] = token_id
    try:
        return config_class(**given)
    except Exception as exc:
        raise Unbuildable(f"its config refuses the generic settings: {type(exc).__name__}: {exc}") from exc


def _settable(config: Any, field: str) -> bool:
    """Whether ``config`` has ``field`` as a value of its own (not a derived property, nor a
    per-layer value that transformers refuses to read globally)."""
    if isinstance(getattr(type(config), field, None), property):
        return False
    try:
        return hasattr(config, field)
    except Exception:
        return False


def save_swept(model_type: str, folder: Path, seed: int = 0) -> Path:
    """A tiny random ``model_type`` with its head, saved with a tokenizer; raises Unbuildable."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    head = type_head(model_type)
    if head is None:
        raise Unbuildable("no text head")
    tokenizer = tokenizer_for(head)
    config = small_config(model_type, tokenizer)
    auto = {"causal": AutoModelForCausalLM, "masked": AutoModelForMaskedLM, "seq2seq": AutoModelForSeq2SeqLM}
    try:
        with torch.device("meta"):
            skeleton = auto[head].from_config(config)
        n = sum(p.numel() for p in skeleton.parameters())
    except Exception as exc:
        raise Unbuildable(f"transformers cannot build it: {type(exc).__name__}: {exc}") from exc
    if n > MAX_PARAMETERS:
        raise Unbuildable(f"{n:,} parameters with the generic settings (some size is not among them)")
    torch.manual_seed(seed)
    try:
        model = auto[head].from_config(config)
    except Exception as exc:
        raise Unbuildable(f"transformers cannot build it: {type(exc).__name__}: {exc}") from exc
    return save_with_norms_moved(model, tokenizer, folder)


def runs_padded(folder: Path, texts: list[str]) -> bool:
    """Whether transformers runs ``texts`` as one right-padded batch of the model in ``folder``."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    model = model.get_encoder() if model.config.is_encoder_decoder else model
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    batch = tokenizer(texts, return_tensors="pt", padding=True, return_token_type_ids=False)
    try:
        with torch.no_grad():
            model(**batch, output_hidden_states=True, use_cache=False)
    except Exception:
        return False
    return True


def reference_states(folder: Path, texts: list[str]) -> list[Any]:
    """transformers' own hidden states of each text alone (no padding): ``(L + 1, n, H)`` each."""
    import inspect

    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    if model.config.is_encoder_decoder:
        model = model.get_encoder()
    n = model.config.num_hidden_layers
    first = next((m[0] for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n), None)
    out = []
    with torch.no_grad():
        for text in texts:
            seen: dict = {}
            hooks = [] if first is None else watch_first_layer(first, seen)
            ids = tokenizer(text, return_tensors="pt", return_token_type_ids=False)["input_ids"]
            given = {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}
            states = list(model(input_ids=ids, output_hidden_states=True, **given).hidden_states)
            for hook in hooks:
                hook.remove()
            if leaves_out_embeddings(
                states, seen
            ):  # Mamba's: no embeddings, each layer's output one place early
                states = [seen["in"], *states[: n - 1], states[n]]
            out.append(torch.stack(states)[:, 0].float().numpy())
    return out


def watch_first_layer(layer: Any, seen: dict) -> list[Any]:
    """Hooks keeping ``layer``'s input (``seen["in"]``) and output (``seen["out"]``)."""

    def before(module: Any, args: tuple, kwargs: dict) -> None:
        seen.setdefault("in", _tensor(args, kwargs))

    def after(module: Any, args: tuple, output: Any) -> None:
        seen.setdefault("out", _tensor((output,), {}))

    return [layer.register_forward_pre_hook(before, with_kwargs=True), layer.register_forward_hook(after)]


def _tensor(args: tuple, kwargs: dict) -> Any:
    import torch

    found = args[0] if args else next(iter(kwargs.values()), None)
    found = found[0] if isinstance(found, tuple | list) else found
    return found if isinstance(found, torch.Tensor) else None


def leaves_out_embeddings(states: list[Any], seen: dict) -> bool:
    """Whether transformers' states leave out the embeddings: state 0 is the first layer's output,
    not its input."""
    given, output = seen.get("in"), seen.get("out")
    if given is None or output is None or output.shape != states[0].shape:
        return False
    return bool(states[0].equal(output)) and not (given.shape == states[0].shape and states[0].equal(given))


TEXTS = ["The bank raised rates.", "A much longer sentence about the river bank, and the fish.", "Hi"]
# why layerwise refuses a type, each a reason that holds: the words its message says it with
REFUSALS = {
    "not text": "does not read text",
    "multimodal": "multimodal model",
    "no model class": "has no base model class",
    "not one state per layer": "hidden states, expected",
    "states change shape": "change shape between layers",
    "needs a language": "language adapter",
    "missing weights": "weights are missing from the checkpoint",
}


def _refusal(message: str) -> str | None:
    return next((kind for kind, words in REFUSALS.items() if words in message), None)


def sweep_one(model_type: str, folder: Path, texts: list[str] = TEXTS) -> dict[str, Any]:
    """One type through the sweep: ``{"type", "outcome", ...}``, the outcome one of ``equal`` (every
    hidden state of every text equals transformers' to 1e-5 of its scale, by both methods),
    ``refused`` (with the listed ``reason``), ``skipped`` (transformers cannot build or run it with
    the generic settings: ``why``) or ``wrong``/``unlisted`` (a failure: ``why``)."""
    import numpy as np

    import layerwise as lw
    from layerwise._model.families.kinds import check_text_transformer
    from layerwise._model.families.media import media_family

    out: dict[str, Any] = {"type": model_type}
    media = media_family(model_type)
    if media is not None:  # Whisper: its seq2seq head decodes text from sound, which its encoder reads
        tests = {"image": "test_media_images.py", "audio": "test_media_audio.py"}[media.modality]
        return {**out, "outcome": "media", "why": f"reads {media.modality}: tests/{tests}"}
    head = type_head(model_type)
    try:
        tokenizer = tokenizer_for(head or "causal")
        config = small_config(model_type, tokenizer)
    except Unbuildable as exc:
        return {**out, "outcome": "skipped", "why": str(exc)[:200]}
    try:
        check_text_transformer(config, model_type)
    except lw.ModelLoadError:  # refused from its config alone: the load must say the same, reading no weight
        folder.mkdir(parents=True, exist_ok=True)
        config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    else:
        try:
            save_swept(model_type, folder)
        except Unbuildable as exc:
            return {**out, "outcome": "skipped", "why": str(exc)[:200]}
    try:
        encoder = lw.Encoder(str(folder), device="cpu")
    except (lw.ModelLoadError, lw.OptionError) as exc:
        reason = _refusal(str(exc))
        outcome = "refused" if reason else "unlisted"
        return {**out, "outcome": outcome, "reason": reason, "why": str(exc)[:300]}
    except Exception as exc:
        if not runs_padded(folder, texts):  # transformers' own padded batch fails too
            return {**out, "outcome": "skipped", "why": f"transformers cannot run a padded batch: {exc}"}
        raise
    try:
        expected = reference_states(folder, texts)
    except Exception as exc:
        return {**out, "outcome": "skipped", "why": f"transformers cannot run it: {type(exc).__name__}"}
    out["path"] = encoder.run_path
    for method in ("hidden_states", "hooks"):
        try:
            stacks = encoder.extract(texts, layers="all", method=method)
        except Exception as exc:
            if not runs_padded(folder, texts):  # transformers' own padded batch fails the same way
                return {**out, "outcome": "skipped", "why": f"transformers cannot run a padded batch: {exc}"}
            raise
        for stack, want in zip(stacks, expected, strict=True):
            if stack.hidden.shape != want.shape:
                return {
                    **out,
                    "outcome": "wrong",
                    "why": f"{method}: shape {stack.hidden.shape} != {want.shape}",
                }
            scale = max(1.0, float(np.abs(want).max()))
            error = float(np.abs(stack.hidden - want).max()) / scale
            if not error <= 1e-5:
                return {**out, "outcome": "wrong", "why": f"{method}: {error:.2e} of the states' scale"}
    return {**out, "outcome": "equal"}
