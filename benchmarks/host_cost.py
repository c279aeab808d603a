"""The host's own cost, on any CPU: layerwise against the tokenizer and the forward alone, with a
model whose forward costs almost nothing.

    python benchmarks/host_cost.py [--sentences 4000] [--documents 40] [--repeats 3] [--profile]

On a GPU the forward is cheap and what binds is the host: tokenising, packing, pooling, copying and
building results. A random BERT one layer deep and 8 wide, with all-MiniLM-L6-v2's real tokenizer,
puts any CPU in that regime: its forward is a few percent of the tokenizer's time. Corpus: UD EWT
train sentences and whole documents (``common.mixed_corpus``), truncated at the model's 256 tokens.

Contenders, interleaved in one process, ``--repeats`` rounds, medians:

- ``tokenizer``: the fast tokenizer's batch call alone (``encode_batch`` with the model's
  truncation, padding off): the first half of the floor;
- ``forward``: layerwise's packed forward alone on pre-tokenised batches (the engine's own batches
  and packing, prepared before the clock starts), every hidden state, nothing copied out: the
  second half of the floor;
- ``loop``: the strongest hand loop for sentence vectors: one tokenizer call, texts sorted by token
  count, padded batches of 128, ``output_hidden_states``, the masked mean of every hidden state in
  torch, one ``.numpy()`` per batch;
- ``embed``: ``enc.embed(texts, layers="all", pool="mean")`` from strings;
- ``embed_words``: ``enc.embed_words(texts, layers="all")`` (first subword) from strings;
- ``extract``: ``enc.extract(texts, layers="all", dtype="float16")`` from strings.

The floor is ``tokenizer + forward``; each call's target is printed beside its ratio to it.
``--profile`` adds where one call of each spends its time, by stage (tokenise, pack, forward, pool,
copy, results), from cProfile of an Encoder with one stream (so that the forward runs where the
profiler sees it). Results: benchmarks/results/host_cost.json.
"""

from __future__ import annotations

import cProfile
import logging
import pstats
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np
from common import copy_default_tokenizer, interleaved_times, mixed_corpus, parser, write_result

import layerwise as lw
from layerwise._engine.call import Call
from layerwise._inputs.raw import normalize_inputs

TARGETS = {"embed": 1.15, "extract": 1.3, "embed_words": 1.5}  # x the floor (issue 64)
LOOP_TARGET = 1.25  # embed's speed over the hand loop's, at least
BATCH = 128

# where a profiled call's time goes: the first stage one of whose markers is in "file:function"
STAGES = {
    "tokenise": ("encode_batch", "encoding.py:", "block.py:_column", "block.py:word_ids", "block.py:offsets",
                 "block.py:segments", "block.py:_no_none", "calls.py:"),
    "pack": ("prepare", "plan_groups", "attention_groups", "length_sorted_batches", "_packed_batches",
             "gather_index", "block.py:columns", "_owner", "plan_batches"),
    "forward": ("packed.py:", "light.py:", "torch._C._nn", "torch.layer_norm", "torch.embedding", "cpu_gemm.py:",
                "index_copy_", "index_select", "new_zeros", "torch.stack"),
    "pool": ("pool_groups", "pool_batch", "device_pool.py:finish", "index_add_", "scatter_reduce"),
    "copy": ("host_copy.py:", "'copy_'", "'numpy'", "'sum'", "isfinite"),
    "results": ("_engine/rows.py:", "_results.py:", "batch_results.py:", "stream.py:", "block.py:tokens",
                "_token_strings", "plan.py:result", "pool.py:"),
}  # fmt: skip


def near_free_model(folder: Path) -> Path:
    """A random BERT, 1 layer x 8 wide (2 heads, 32 inner), seed 0, with the default model's tokenizer."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    BertModel(config).save_pretrained(folder)
    return copy_default_tokenizer(folder)


def hand_loop(folder: Path):
    """The strongest loop we could write for sentence vectors of every layer (see the docstring)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()

    def run(texts: list[str]) -> int:
        encoded = tokenizer(texts, truncation=True, max_length=256)["input_ids"]
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]), reverse=True)
        out = [None] * len(texts)
        with torch.inference_mode():
            for start in range(0, len(order), BATCH):
                rows = order[start : start + BATCH]
                padded = tokenizer.pad({"input_ids": [encoded[i] for i in rows]}, return_tensors="pt")
                states = model(**padded, output_hidden_states=True).hidden_states
                mask = padded["attention_mask"][None, :, :, None].float()  # (1, B, T, 1)
                stacked = torch.stack(states)  # (L, B, T, H)
                mean = ((stacked * mask).sum(2) / mask.sum(2)).transpose(0, 1).numpy()  # (B, L, H)
                for row, i in enumerate(rows):
                    out[i] = mean[row]
        return int(sum(len(ids) for ids in encoded))

    return run


def stage_split(profile: cProfile.Profile) -> dict[str, float]:
    """Seconds per stage: the tottime of each function assigned to the first stage that names it."""
    stats = pstats.Stats(profile)
    split = dict.fromkeys([*STAGES, "other"], 0.0)
    for (file, _, name), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{file}:{name}"
        stage = next((s for s, marks in STAGES.items() if any(m in where for m in marks)), "other")
        split[stage] += tottime
    return {k: round(v, 4) for k, v in split.items()}


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--sentences", type=int, default=4000)
    args_parser.add_argument("--documents", type=int, default=40)
    args_parser.add_argument("--repeats", type=int, default=3)
    args_parser.add_argument("--profile", action="store_true")
    args_parser.add_argument("--output", type=Path, default=None, help="the result file (default: results/)")
    args = args_parser.parse_args()
    logging.getLogger("layerwise").setLevel(logging.ERROR)  # the documents' truncation warning
    texts = mixed_corpus(args.sentences, args.documents)
    folder = Path(tempfile.mkdtemp(prefix="lw-near-free-"))
    try:
        report = run(near_free_model(folder), texts, args.repeats, args.profile)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    write_result("host_cost", report, args.output)


def run(folder: Path, texts: list[str], repeats: int, profile: bool) -> dict:
    import torch

    enc = lw.Encoder(folder, max_length=256)
    backend = enc.inputs.capped_tokenizer()
    n_tokens = sum(len(e.ids) for e in backend.encode_batch(texts))
    engine = enc.engine
    block = enc.inputs.encode_block(normalize_inputs(texts))
    layers = tuple(range(enc.n_hidden_states))
    call = Call(layers)
    batches = [np.asarray(b) for b in engine.plan_batches(block.lengths.tolist(), call, True)]
    packed = engine.packed
    prepared = [packed.prepare(block.columns(rows), with_token_types=engine.with_token_types, device=enc.device)
                for rows in batches]  # fmt: skip

    def forward_one(batch) -> None:
        with torch.inference_mode():
            packed.forward(batch, layers)

    def forward() -> int:  # on the engine's streams, as its own forward runs
        if engine.pool is None:
            for batch in prepared:
                forward_one(batch)
        else:
            for future in [engine.pool.submit(forward_one, batch) for batch in prepared]:
                future.result()
        return n_tokens

    def tokenizer() -> int:
        return sum(len(e.ids) for e in backend.encode_batch(texts))

    def embed() -> int:
        enc.embed(texts, layers="all", pool="mean", progress=False)
        return n_tokens

    def embed_words() -> int:
        enc.embed_words(texts, layers="all", progress=False)
        return n_tokens

    def extract() -> int:
        enc.extract(texts, layers="all", dtype="float16", progress=False)
        return n_tokens

    contenders = {"tokenizer": tokenizer, "forward": forward, "loop": hand_loop(folder), "embed": embed,
                  "embed_words": embed_words, "extract": extract}  # fmt: skip
    loop = contenders["loop"]
    contenders["loop"] = lambda: loop(texts)
    for fn in contenders.values():  # warm-up
        fn()
    times = interleaved_times(contenders, repeats, n_tokens)
    median = {k: statistics.median(v) for k, v in times.items()}
    floor = median["tokenizer"] + median["forward"]
    print(f"{len(texts)} texts, {n_tokens} tokens; floor (tokenizer + forward) {floor:.3f} s")
    figures: dict = {}
    for key, seconds in median.items():
        figures[key] = {"seconds": round(seconds, 4), "tokens_per_s": round(n_tokens / seconds),
                        "x_floor": round(seconds / floor, 3)}  # fmt: skip
        target = TARGETS.get(key)
        limit = f"  target <= {target}x" if target else ""
        print(
            f"{key:12s} {seconds:.3f} s  {n_tokens / seconds:>10,.0f} tok/s  {seconds / floor:.2f}x the floor{limit}"
        )
    over_loop = median["loop"] / median["embed"]
    print(f"embed runs {over_loop:.2f}x the hand loop (target >= {LOOP_TARGET}x)")
    report = {
        "texts": len(texts), "tokens": n_tokens, "repeats": repeats, "floor_s": round(floor, 4),
        "figures": figures, "embed_over_loop": round(over_loop, 3), "targets": TARGETS,
        "loop_target": LOOP_TARGET, "rounds": {k: [round(t, 4) for t in v] for k, v in times.items()},
        "held": {**{k: figures[k]["x_floor"] <= t for k, t in TARGETS.items()},
                 "embed_over_loop": over_loop >= LOOP_TARGET},
    }  # fmt: skip
    if profile:  # one stream: the forward runs on the calling thread, where cProfile sees it
        alone = lw.Encoder(folder, max_length=256, concurrent_forwards=1)
        calls = {"embed": lambda: alone.embed(texts, layers="all", pool="mean", progress=False),
                 "embed_words": lambda: alone.embed_words(texts, layers="all", progress=False),
                 "extract": lambda: alone.extract(texts, layers="all", dtype="float16", progress=False)}  # fmt: skip
        report["stages_s"] = {"note": "one stream, under cProfile (which slows Python, not C)"}
        for key, call in calls.items():
            call()
            prof = cProfile.Profile()
            prof.runcall(call)
            report["stages_s"][key] = stage_split(prof)
            print(key, report["stages_s"][key])
    return report


if __name__ == "__main__":
    main()
