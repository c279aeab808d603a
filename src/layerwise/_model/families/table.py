"""The families layerwise knows more of than transformers' mappings say: one row each (docs/models.md's
table is rendered from it). Adding a family whose blocks transformers implements, and whose
embeddings are the word table with learned or rotary positions, is one row: its layer list, final
norm, taps and positions; the packed forward, streaming, the taps, the final norm, the light
loader, ``info -m`` and the docs read it here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# Sub-module paths of a tap inside one layer (forward/hooks.py reads them)
BERT_TAPS = {
    "attention_probs": "attention.self",
    "attention_output": "attention",
    "intermediate": "intermediate",
    "attn_out": "attention.output.dense",
    "mlp_out": "output.dense",
}
# decoder LMs (pre-norm blocks): no module outputs the attention block's normed output or the
# feed-forward activations as the BERT taps mean them; attn_out and mlp_out are what each adds to
# the residual stream (GPT-NeoX and Phi add both to the same stream: parallel blocks)
PRE_NORM_TAPS = {"attention_probs": "self_attn", "attn_out": "self_attn", "mlp_out": "mlp"}
# post-norm blocks (Gemma 2 and 3, OLMo 2): what each adds is its output norm's
POST_NORM_TAPS = {
    "attention_probs": "self_attn",
    "attn_out": "post_attention_layernorm",
    "mlp_out": "post_feedforward_layernorm",
}
Positions = Literal[
    "learned", "learned after a padding row", "learned, offset 2", "rotary", "rotary per layer type", "other"
]


@dataclass(frozen=True)
class Family:
    """What layerwise knows of one model type, beyond what transformers' mappings and the model's
    config say (its kind comes from those: kinds.py).

    ``forward``: layerwise's own packed forward and the adapter it runs the family with: ``"bert"``
    (the BERT layout: forward/packed.py, on the light model's or transformers' modules),
    ``"blocks"`` (transformers' own blocks one at a time: forward/decoder_blocks.py), or None
    (transformers' padded forward, the general path). A family with a forward of its own streams
    layer by layer too. ``layers``: where its layer list is in the base model; ``final_norm``: its
    final norm's path (None: none; ``"found at load"``: found by name and checked against
    transformers at load); ``taps``: each tap's sub-module of a layer; ``positions``: how positions
    enter. ``examples``, ``tested`` and ``notes`` (a column's own text) are docs/models.md's columns,
    rendered from this table."""

    kind: Literal["encoder", "decoder"]
    forward: Literal["bert", "blocks"] | None
    layers: str | None = None
    final_norm: str | None = "found at load"
    taps: Mapping[str, str] = field(default_factory=dict)
    positions: Positions = "other"
    examples: str = ""
    tested: str = "transformers"
    notes: Mapping[str, str] = field(default_factory=dict)  # docs/models.md: a column's text, where given


def _decoder(layers: str, norm: str, positions: Positions, examples: str, **given: Any) -> Family:
    taps = given.pop("taps", PRE_NORM_TAPS)
    return Family("decoder", "blocks", layers, norm, taps, positions, examples, **given)


def _general(kind: Literal["encoder", "decoder"], examples: str, **given: Any) -> Family:
    """A family transformers' padded forward runs (the general path), its final norm found at load."""
    return Family(kind, None, examples=examples, **given)


_PADDING_ROW: Positions = "learned after a padding row"
_LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma")
_DISTILBERTS = "distilbert-base-uncased, all-mpnet-base-v2"
_ST = "transformers, sentence-transformers"
_PHIS = "microsoft/phi-2, Phi-3, Phi-3.5, Phi-4"
_OLMOS = "allenai/OLMo-1B-hf, OLMo-2-0425-1B"
_T5S = "t5-base, flan-t5, mt5, sentence-t5, the text encoders of image pipelines"
_BARTS = "facebook/bart-base, mBART-50, Helsinki-NLP/opus-mt-*"
_FULL_RUN_EXAMPLES = "albert-base-v2, xlm-mlm-en-2048, allenai/longformer-base-4096"
_YES_ENCODER = 'yes: `final_norm` True, False or `"all"`'
_BERTS = "bert-base-uncased, all-MiniLM-L6-v2, roberta-base, xlm-roberta-base"
_BERT_TESTED = "sentence-transformers, a NumPy BERT, transformers"
_BERT_POSITIONS: tuple[tuple[str, Positions], ...] = (
    ("bert", "learned"),
    ("roberta", _PADDING_ROW),
    ("xlm-roberta", _PADDING_ROW),
    ("camembert", _PADDING_ROW),
    ("electra", "learned"),
)
_LLAMAS = "Llama 3, Mistral 7B, Qwen2.5, Qwen3, Gemma 1–3, SmolLM2"
_SMOLLM2 = "transformers, SmolLM2's GGUF"
_DISTILBERT_TAPS = {
    "attention_probs": "attention",
    "attention_output": "sa_layer_norm",
    "intermediate": "ffn.activation",
    "attn_out": "attention.out_lin",
    "mlp_out": "ffn.lin2",
}
_MPNET_TAPS = {
    "attention_probs": "attention.attn",
    "attention_output": "attention",
    "intermediate": "intermediate",
    "attn_out": "attention.attn.o",
    "mlp_out": "output.dense",
}
_ENCODERS_OF = "(encoder; a full or a `T5EncoderModel` checkpoint)"
_FULL_RUN = {"path": "general: every state from transformers' own full run"}
# state-space, recurrent and hybrid models: every block's output is a hidden state (tests/test_sweep.py)
# (a table of model types, kept in rows)
_SSM_TYPES = (
    "mamba", "mamba2", "falcon_mamba", "falcon_h1", "zamba2", "bamba", "granitemoehybrid", "nemotron_h",
    "jamba", "rwkv", "qwen3_next", "fnet",
)  # fmt: skip
_SSM = "state-spaces/mamba-130m-hf, Mamba-2, Falcon-H1, Zamba2, Bamba, Granite 4, Nemotron-H, Jamba, RWKV-4"
# docs/models.md's rows, in its order: consecutive rows alike in every column share a line there
FAMILIES: dict[str, Family] = {
    **{
        name: Family("encoder", "bert", "encoder.layer", None, BERT_TAPS, positions, _BERTS, _BERT_TESTED)
        for name, positions in _BERT_POSITIONS
    },
    "distilbert": Family(
        "encoder", None, "transformer.layer", None, _DISTILBERT_TAPS, "learned", _DISTILBERTS, _ST
    ),
    "mpnet": Family("encoder", None, "encoder.layer", None, _MPNET_TAPS, _PADDING_ROW, _DISTILBERTS, _ST),
    **{name: _decoder("layers", "norm", "rotary", _LLAMAS, tested=_SMOLLM2) for name in _LLAMA_TYPES},
    "gemma2": _decoder("layers", "norm", "rotary", _LLAMAS, taps=POST_NORM_TAPS, tested=_SMOLLM2),
    "gemma3_text": _decoder(
        "layers", "norm", "rotary per layer type", _LLAMAS, taps=POST_NORM_TAPS, tested=_SMOLLM2
    ),
    "gpt2": _decoder(
        "h",
        "ln_f",
        "learned",
        "gpt2, distilgpt2",
        taps={**PRE_NORM_TAPS, "attention_probs": "attn", "attn_out": "attn"},
    ),
    "gpt_neox": _decoder(
        "layers",
        "final_layer_norm",
        "rotary",
        "Pythia (EleutherAI/pythia-70m … 12b), GPT-NeoX-20B",
        taps={**PRE_NORM_TAPS, "attention_probs": "attention", "attn_out": "attention"},
    ),
    # OPT's feed-forward is two linears on the flattened batch inside the layer: no module gives what
    # it adds in the batch's shape
    "opt": _decoder(
        "decoder.layers",
        "decoder.final_layer_norm",
        "learned, offset 2",
        "facebook/opt-125m … 66b",
        taps={"attention_probs": "self_attn", "attn_out": "self_attn"},
        notes={
            "streaming": "yes (not OPT-350m: its embeddings are projected)",
            "final norm": "yes (OPT-350m: none)",
        },
    ),
    "phi": _decoder("layers", "final_layernorm", "rotary", _PHIS),
    "phi3": _decoder("layers", "norm", "rotary", _PHIS),
    "olmo": _decoder("layers", "norm", "rotary", _OLMOS),
    "olmo2": _decoder("layers", "norm", "rotary", _OLMOS, taps=POST_NORM_TAPS),
    **{name: _general("decoder", "Falcon, BLOOM, GPT-J") for name in ("falcon", "bloom", "gptj")},
    **{
        name: _general("decoder", "StableLM 2, StarCoder2", taps=PRE_NORM_TAPS)
        for name in ("stablelm", "starcoder2")
    },
    **{name: _general("decoder", "Granite 3, StarCoder") for name in ("granite", "gpt_bigcode")},
    **{
        name: _general(
            "decoder",
            "Mixtral 8x7B, Qwen1.5-MoE",
            taps=PRE_NORM_TAPS,
            notes={"type": "(mixtures of experts)"},
        )
        for name in ("mixtral", "qwen2_moe")
    },
    "modernbert": Family(
        "encoder",
        "blocks",
        "layers",
        "final_norm",
        {},
        "rotary per layer type",
        "answerdotai/ModernBERT-base, gte-modernbert, modernbert-embed",
        notes={"path": "packed (local layers within their window)"},
    ),
    "deberta-v2": _general("encoder", "microsoft/deberta-v3-base", notes={"final norm": "none"}),
    **{
        name: _general("encoder", _T5S, notes={"type": _ENCODERS_OF, "final norm": _YES_ENCODER})
        for name in ("t5", "mt5", "umt5")
    },
    **{
        name: _general(
            "encoder", _BARTS, notes={"type": "(encoder)", "final norm": "BART none; mBART its own"}
        )
        for name in ("bart", "mbart", "marian")
    },
    **{
        name: _general("encoder", _FULL_RUN_EXAMPLES, notes=_FULL_RUN)
        for name in ("albert", "xlm", "flaubert", "longformer", "led", "cpmant")
    },
    **{
        name: _general("decoder", _SSM, notes={"type": "(state-space, recurrent, hybrid)"})
        for name in _SSM_TYPES
    },
}


def family(model_type: str | None) -> Family | None:
    """The row of ``model_type``, or None where layerwise knows nothing beyond transformers (it runs
    on the general path, its final norm found at load)."""
    return FAMILIES.get(model_type or "")


def families_with_taps() -> list[str]:
    """The model types whose rows name their taps' modules, sorted."""
    return sorted(t for t, row in FAMILIES.items() if row.taps)


def packed_families(forward: str, kind: str | None = None) -> tuple[str, ...]:
    """The model types whose packed forward is ``forward`` (of ``kind``, when given)."""
    return tuple(t for t, f in FAMILIES.items() if f.forward == forward and kind in (None, f.kind))


_TAP_ORDER = ("attn_out", "mlp_out", "attention_probs")
_YES_DECODER = "yes"


def docs_rows() -> list[list[str]]:
    """docs/models.md's table: model types, example checkpoints, path, streaming, taps, final norm,
    tested against; consecutive families alike in every column share a row."""
    rows: list[list[str]] = []
    last: tuple | None = None
    for name, row in FAMILIES.items():
        cells = [row.examples, *_cells(row), row.tested]
        key = (row.notes.get("type", ""), *cells)
        if key == last:
            rows[-1][0] = (
                rows[-1][0].replace(" (", f", `{name}` (", 1) if key[0] else f"{rows[-1][0]}, `{name}`"
            )
            continue
        rows.append([f"`{name}` {key[0]}".rstrip(), *cells])
        last = key
    other = ["any other text model transformers has a class for", "", "general", "no", "none"]
    rows.append([*other, "found and checked at load", "the load-time check"])
    return rows


def _cells(row: Family) -> list[str]:
    notes = row.notes
    taps = "all five" if len(row.taps) == 5 else ", ".join(f"`{t}`" for t in _TAP_ORDER if t in row.taps)
    if row.final_norm is None:
        norm = "none"
    elif row.final_norm == "found at load":
        norm = "found and checked at load"
    else:
        norm = _YES_DECODER if row.kind == "decoder" else 'yes: `final_norm` True, False or `"all"`'
    return [
        notes.get("path", "packed" if row.forward else "general"),
        notes.get("streaming", "yes" if row.forward else "no"),
        taps or "none",
        notes.get("final norm", norm),
    ]
