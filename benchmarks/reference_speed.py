"""The reference BERT's packed (unpadded) forward against Hugging Face's padded BertModel.

    python benchmarks/reference_speed.py [--sentences 1000] [--documents 40] [--repeats 2]

The same mixed-length UD EWT corpus as extract_speed.py, the default model, batches sorted by
length under layerwise's default budget (<= 128 texts, <= 2048 padded tokens); every hidden state
of every real token is computed. Also checks that both agree to 1e-5. Results go to
benchmarks/results/reference_speed.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import mixed_corpus, write_result  # noqa: E402

import layerwise as lw  # noqa: E402
from layerwise._inputs.batches import length_sorted_batches  # noqa: E402
from layerwise.reference import Bert  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--documents", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    enc = lw.Encoder(device="cpu", max_length=512)
    ref = Bert.from_hf(enc.model)
    texts = mixed_corpus(args.sentences, args.documents)
    encoded = enc.tokenize(texts)
    batches = length_sorted_batches([len(e) for e in encoded], enc.batch_size, enc.max_tokens)
    n_tokens = sum(len(e) for e in encoded)
    padded_inputs, packed_inputs = [], []
    for batch in batches:
        items = [encoded[i] for i in batch]
        width = max(len(e) for e in items)
        ids = torch.zeros(len(items), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, e in enumerate(items):
            ids[row, : len(e)] = torch.tensor(e.ids)
            mask[row, : len(e)] = 1
        padded_inputs.append((ids, mask))
        flat = torch.tensor([i for e in items for i in e.ids])
        packed_inputs.append((flat, torch.tensor([len(e) for e in items])))

    def run_hf() -> None:
        with torch.inference_mode():
            for ids, mask in padded_inputs:
                enc.model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids),
                          output_hidden_states=True)  # fmt: skip

    def run_reference_padded() -> None:
        with torch.inference_mode():
            for ids, mask in padded_inputs:
                ref(ids, torch.zeros_like(ids), mask)

    def run_packed() -> None:
        with torch.inference_mode():
            for flat, lengths in packed_inputs:
                ref.forward_packed(flat, torch.zeros_like(flat), lengths)

    # agreement on the first batch
    with torch.inference_mode():
        ids, mask = padded_inputs[-1]
        hf = torch.stack(
            enc.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        )
        flat, lengths = packed_inputs[-1]
        packed = ref.forward_packed(flat, torch.zeros_like(flat), lengths)
        worst = float((packed - hf[:, mask.bool()]).abs().max())
    print(
        f"corpus: {len(texts)} texts, {n_tokens} tokens, {len(batches)} batches; packed vs HF max abs diff {worst:.1e}"
    )
    timings = {}
    for name, fn in (
        ("hf_padded", run_hf),
        ("reference_padded", run_reference_padded),
        ("reference_packed", run_packed),
    ):
        fn()  # warm-up
        best = min(_timed(fn) for _ in range(args.repeats))
        timings[name] = best
        print(
            f"{name:18s} {best:6.2f} s  {n_tokens / best:7.0f} tokens/s  {timings.get('hf_padded', best) / best:.2f}x of HF"
        )
    padding = sum(ids.numel() for ids, _ in padded_inputs) / n_tokens
    print(f"padded tokens / real tokens with these batches: {padding:.3f}")
    write_result("reference_speed", {
        "texts": len(texts), "tokens": n_tokens, "max_abs_diff": worst, "padding_ratio": round(padding, 3),
        "seconds": {k: round(v, 3) for k, v in timings.items()},
        "tokens_per_s": {k: round(n_tokens / v) for k, v in timings.items()},
    })  # fmt: skip


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
