"""On a CUDA GPU: how many attention grids a packed batch should be split into.

    python benchmarks/gpu_groups.py [--sentences 2000] [--documents 50] [--repeats 3]

The packed forward runs attention per group of texts of similar length (``_model/forward/packed.py``:
``attention_groups``), minimising the padded query-key pairs plus a fixed cost per group. On a CPU
a group costs little (``GROUP_COST`` = 4,096 pairs); on a GPU each group is a handful of kernel
launches. This sweep sets the cost per group from 4,096 pairs to one grid a batch and times, on the
mixed UD EWT corpus of gpu_speed.py and BERT-base shape (random weights, float16 and bfloat16):

- ``packed_forward``: layerwise's packed forward of the corpus's batches, tokenised beforehand,
  nothing copied out;
- ``embed``: ``enc.embed(texts, layers="all")`` from strings;
- ``extract_float16``: ``enc.extract(texts, layers="all", dtype="float16")``.

The best of ``--repeats`` after a warm-up, each in tokens/s, with the groups of each batch. The CUDA
default (``GPU_GROUP_COST``) was chosen from it. Results: benchmarks/results/gpu_groups.json.
(``--device cpu`` with a few texts is a dry run of the script, not a figure.)
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from common import bert_base_folder, mixed_corpus, parser, write_result

import layerwise as lw
import layerwise._model.forward.packed as packed_module
from layerwise._engine.call import Call
from layerwise._inputs.raw import normalize_inputs

COSTS = (4096, 65536, 1 << 20, 1 << 24, 1 << 40)  # 2^40: one grid a batch


def _best(fn, repeats: int, device: str) -> float:
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return min(times)


def sweep(folder: Path, dtype: str, texts: list[str], repeats: int, device: str) -> list[dict]:
    enc = lw.Encoder(folder, device=device, model_dtype=dtype, max_length=512)
    block = enc.inputs.encode_block(normalize_inputs(texts), detailed=False)
    layers = tuple(range(enc.n_hidden_states))
    batches = [np.asarray(b) for b in enc.engine.plan_batches(block.lengths.tolist(), Call(layers), True)]
    rows = []
    for cost in COSTS:
        # the device's own cost, replaced for this sweep (plan_groups reads it at every batch)
        packed_module.GPU_GROUP_COST = packed_module.GROUP_COST = cost
        groups = [len(packed_module.attention_groups(block.lengths[r].tolist(), cost)) for r in batches]

        def forward() -> None:
            with torch.inference_mode():
                for r in batches:
                    prepared = enc.engine.packed.prepare(
                        block.columns(r), with_token_types=True, device=enc.device
                    )
                    enc.engine.packed.forward(prepared, layers)

        def embed() -> None:
            enc.embed(texts, layers="all")

        def extract() -> None:
            enc.extract(texts, layers="all", dtype="float16")

        for fn in (forward, embed, extract):
            fn()  # warm-up: new grid shapes
        seconds = {name: _best(fn, repeats, device) for name, fn in
                   (("packed_forward", forward), ("embed", embed), ("extract_float16", extract))}  # fmt: skip
        rate = {name: round(block.n_tokens / s) for name, s in seconds.items()}
        rows.append({"dtype": dtype, "group_cost": cost, "groups_per_batch": groups, "tokens_per_s": rate})
        print(f"{dtype} group cost {cost:>17,}: groups {groups}  packed forward {rate['packed_forward']:>10,}  "
              f"embed {rate['embed']:>10,}  extract float16 {rate['extract_float16']:>10,} tokens/s", flush=True)  # fmt: skip
    return rows


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--sentences", type=int, default=2000)
    args_parser.add_argument("--documents", type=int, default=50)
    args_parser.add_argument("--repeats", type=int, default=3)
    args_parser.add_argument("--device", default="cuda")
    args_parser.add_argument("--output", type=Path, default=None, help="the result file (default: results/)")
    args = args_parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this sweep is for a GPU")
    logging.getLogger("layerwise").setLevel(logging.ERROR)
    texts = mixed_corpus(args.sentences, args.documents)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "none (a dry run on the CPU)"
    dtypes = ("float16", "bfloat16") if args.device == "cuda" else ("float32",)
    with bert_base_folder() as base:
        rows = [row for dtype in dtypes for row in sweep(base, dtype, texts, args.repeats, args.device)]
    write_result(
        "gpu_groups", {"gpu": gpu, "torch": torch.__version__, "texts": len(texts), "rows": rows}, args.output
    )


if __name__ == "__main__":
    main()
