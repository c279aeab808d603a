"""The newly packed decoder families at a 12 x 768 shape: the packed forward and the general path
against the best hand-written transformers loop, every hidden state of every token.

    python benchmarks/family_speed.py [--sentences 150] [--documents 0] [--repeats 3] [--families gpt_neox,opt]

For each family (GPT-NeoX/Pythia, OPT, Phi, Phi-3, OLMo, OLMo-2) a randomly initialised model of
12 layers x 768 (12 heads, feed-forward 3072: Pythia-160m's and OPT-125m's shapes) with a
tokenizer of its kind (tests/tokenizer_kinds.py), on UD EWT sentences: the case where a padded loop
pads least (``--documents N`` mixes in whole documents, truncated at 512 tokens; a batch of 32 that
holds one then pads every sentence to its length, and the loop falls several times behind). Contenders, timed ``--repeats`` times interleaved (medians), each producing every
hidden state of every real token as float32 NumPy:

- ``best_loop``: texts sorted by token count, batches of 32, right-padded, ``output_hidden_states``
  under ``torch.inference_mode``, in a process of its own (benchmarks/handwritten_loops.py memory);
- ``packed``: ``Encoder(model).extract(texts, layers="all")``;
- ``general``: the same with ``packed=False``: transformers' own forward on layerwise's
  length-sorted, token-budget batches (the path of every family that is not packed). It is also
  what a loop with token-budget batches would run, so ``packed_over_general`` is the packed
  forward's gain over such a loop.

Targets (issue: every transformer): packed >= 1.2x the loop, general >= 0.95x.
Results: benchmarks/results/family_speed.json.
"""

from __future__ import annotations

import logging
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import torch  # noqa: E402
from common import fresh_loop, interleaved_times, mixed_corpus, parser, write_result  # noqa: E402

import layerwise as lw  # noqa: E402

FAMILIES = ("gpt_neox", "opt", "phi", "phi3", "olmo", "olmo2")
SHAPE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
TARGETS = {"packed": 1.2, "general": 0.95}


def family_folder(model_type: str) -> Path:
    """A random 12 x 768 model of ``model_type`` with its tokenizer kind, in a temporary folder."""
    from any_models import FAMILIES as KINDS
    from any_models import tokenizer_of
    from transformers import CONFIG_MAPPING, AutoModel

    tokenizer = tokenizer_of(model_type)
    tokenizer.model_max_length = 512
    fields = {**KINDS[model_type][1], **SHAPE, "max_position_embeddings": 512, "vocab_size": len(tokenizer)}
    if model_type == "opt":
        fields.update(ffn_dim=3072, word_embed_proj_dim=768)
    if "num_key_value_heads" in fields:
        fields["num_key_value_heads"] = 4
    for special in ("pad", "bos", "eos"):
        if getattr(tokenizer, f"{special}_token_id") is not None:
            fields[f"{special}_token_id"] = getattr(tokenizer, f"{special}_token_id")
    folder = Path(tempfile.mkdtemp(prefix=f"lw-{model_type}-"))
    torch.manual_seed(0)
    AutoModel.from_config(CONFIG_MAPPING[model_type](**fields)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def measure(model_type: str, texts: list[str], repeats: int) -> dict:
    folder = family_folder(model_type)
    try:
        packed = lw.Encoder(folder, device="cpu", max_length=512)
        general = lw.Encoder(folder, device="cpu", max_length=512, packed=False)
        assert packed.run_path == "packed" and general.run_path == "general"
        n_tokens = sum(len(e) for e in packed.tokenize(texts))
        methods = {
            "best_loop": fresh_loop(str(folder), texts),
            "packed": lambda: sum(s.n_tokens for s in packed.extract(texts, layers="all", progress=False)),
            "general": lambda: sum(s.n_tokens for s in general.extract(texts, layers="all", progress=False)),
        }
        for encoder in (packed, general):
            encoder.extract(texts[:16], progress=False)  # warm-up, as the loop warms up
        times = interleaved_times(methods, repeats, n_tokens)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rates = {k: n_tokens / statistics.median(v) for k, v in times.items()}
    ratios = {k: round(rates[k] / rates["best_loop"], 2) for k in TARGETS}
    # the general path is transformers' forward on token-budget batches: a careful loop's best case
    packed_over_general = round(rates["packed"] / rates["general"], 2)
    print(f"\n{model_type}: {len(texts)} texts, {n_tokens} tokens, 12 layers x 768")
    for key, rate in rates.items():
        ratio = f"  {ratios[key]}x the loop (target {TARGETS[key]}x)" if key in ratios else ""
        print(f"  {key:10s} {rate:8,.0f} tok/s{ratio}  (runs: {[round(t, 2) for t in times[key]]})")
    print(f"  packed / general: {packed_over_general}x")
    return {
        "tokens": n_tokens,
        "tokens_per_s": {k: round(v) for k, v in rates.items()},
        "over_best_loop": ratios,
        "packed_over_general": packed_over_general,
        "meets_targets": {k: ratios[k] >= TARGETS[k] for k in TARGETS},
        "seconds": {k: [round(t, 2) for t in v] for k, v in times.items()},
    }


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--sentences", type=int, default=150)
    args_parser.add_argument("--documents", type=int, default=0)
    args_parser.add_argument("--repeats", type=int, default=3)
    args_parser.add_argument("--families", default=",".join(FAMILIES))
    args = args_parser.parse_args()
    logging.getLogger("layerwise").setLevel(logging.ERROR)  # documents past 512 tokens are truncated
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    texts = mixed_corpus(args.sentences, args.documents)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    report = {
        "shape": "12 layers x 768, 12 heads, feed-forward 3072",
        "texts": len(texts),
        "targets": TARGETS,
        "families": {t: measure(t, texts, args.repeats) for t in args.families.split(",") if t},
    }
    write_result("family_speed", report)


if __name__ == "__main__":
    main()
