"""The CPU forward against its roof: the packed forward beside the GEMMs it runs, and the machine's
GEMM rate, in one run.

    python benchmarks/roof.py [--texts 400] [--repeats 3] [--dtypes float32,bfloat16] [--models ...]

For each model (the default all-MiniLM-L6-v2; a random ``BertConfig()``, BERT-base's shapes; a random
Llama of 12 layers × 768) and each dtype (float32; bfloat16 where the CPU has bfloat16 matrix units:
AMX or AVX-512 BF16, read from /proc/cpuinfo), on a mixed-length UD EWT corpus:

- ``forward``: layerwise's packed forward alone, every hidden state, on the engine's own batches of
  the tokenised corpus, one batch at a time on all of torch's threads (``concurrent_forwards=1``);
- ``gemms``: the same linear layers' matrix products alone, at the row counts those batches run
  (every layer's weights, random inputs), with torch's faster CPU library for these shapes (oneDNN
  with prepacked weights, or MKL); the roof the forward cannot pass;
- ``machine``: the machine's best GEMM rate in that dtype (2048², torch's threads, the fastest of
  ``@``, ``F.linear`` and oneDNN prepacked: common.best_matmul_rate; measured before
  and after the rounds, the better kept);
- ``extract``: ``Encoder(model_dtype=...).extract(texts, layers="all")``, what a user runs (its
  default streams: two for a model up to 512 wide, so its rate may pass the one-stream forward's);
- each op kind's share of the forward's CPU time (torch profiler, self time): attention, GEMM,
  norms, activations, other elementwise ops, gathers and copies, other.

Ratios to read: ``forward / gemms`` (how close the forward is to its own GEMMs) and the forward's
GEMM FLOPs per second against ``machine``. Medians of ``--repeats`` interleaved rounds. Results:
benchmarks/results/roof.json.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    best_matmul_rate,
    best_of,
    copy_default_tokenizer,
    interleaved_times,
    mixed_corpus,
    parser,
    write_result,
)

import layerwise as lw
from layerwise._encoder.calls import Call
from layerwise._host.cpu import bf16_units
from layerwise._inputs.raw import normalize_inputs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# op names (torch profiler, "aten::" dropped) by kind, tried in this order: a name holding one of a
# kind's parts is of that kind (attention first: its bmm is not a linear layer's); the rest is "other"
KINDS = {
    "attention": ("scaled_dot_product", "_flash_attention", "_efficient_attention", "softmax", "bmm"),
    "gemm": ("addmm", "linear", "matmul", "mkldnn", "onednn", "mm"),
    "norm": ("layer_norm", "rms_norm", "rsqrt", "pow", "mean"),
    "activation": ("gelu", "silu", "tanh", "sigmoid", "erf"),
    "elementwise": ("add", "mul", "div", "sub", "neg"),
    "gather_copy": ("index_select", "index_copy", "index_put", "gather", "scatter", "copy_", "cat", "fill_",
                    "_to_copy", "contiguous", "clone", "embedding", "stack", "zeros", "empty", "masked", "to"),
}  # fmt: skip


def llama_folder(base: Path) -> Path:
    """A random Llama of 12 layers × 768 (12 heads, feed-forward 2,048) with the default tokenizer."""
    from transformers import LlamaConfig, LlamaModel

    folder = base / "llama-12x768"
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=30522, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                         num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=512,
                         pad_token_id=0, bos_token_id=101, eos_token_id=102)  # the WordPiece ids  # fmt: skip
    LlamaModel(config).save_pretrained(folder)
    return copy_default_tokenizer(folder)


def bert_base(base: Path) -> Path:
    from transformers import BertConfig, BertModel

    folder = base / "bert-base"
    torch.manual_seed(0)
    BertModel(BertConfig()).save_pretrained(folder)
    return copy_default_tokenizer(folder)


def linear_weights(model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The (weight, bias) of every matrix product the packed forward runs in ``model``'s layers (not
    the embeddings or a head): each module of a layer with a 2-D ``weight``, a BERT layer's query,
    key and value as the one matrix the packed forward multiplies by (forward/packed.py)."""
    found: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    fused: dict[str, list[torch.nn.Module]] = defaultdict(list)
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if ".layer" not in f".{name}" or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        parent, _, leaf = name.rpartition(".")
        if leaf in ("query", "key", "value"):
            fused[parent].append(module)
        else:
            found.append((weight, getattr(module, "bias", None)))
    for parts in fused.values():
        biases = [m.bias for m in parts]
        bias = torch.cat(biases) if all(b is not None for b in biases) else None
        found.append((torch.cat([m.weight for m in parts]), bias))
    return found


def gemm_runner(weights, row_counts: list[int], dtype: torch.dtype):
    """A function running every weight's GEMM at every row count, with the faster of torch's two
    CPU libraries for these shapes; and the GEMMs' FLOPs."""
    from layerwise._model.forward.cpu_gemm import onednn_linear, prepack

    inputs = {
        rows: {w.shape[1]: torch.randn(rows, w.shape[1], dtype=dtype) for w, _ in weights}
        for rows in row_counts
    }
    flop = sum(2 * rows * w.shape[0] * w.shape[1] for rows in row_counts for w, _ in weights) / 1e9

    def plain() -> None:
        for rows in row_counts:
            for w, b in weights:
                torch.nn.functional.linear(inputs[rows][w.shape[1]], w, b)

    runners = [plain]
    try:
        packed = [(prepack(w), b) for w, b in weights]

        def onednn() -> None:
            for rows in row_counts:
                for (p, b), (w, _) in zip(packed, weights, strict=True):
                    onednn_linear(inputs[rows][w.shape[1]], p, b)

        onednn()
        runners.append(onednn)
    except (AttributeError, RuntimeError):
        pass
    with torch.inference_mode():
        fastest = min(runners, key=lambda run: best_of(2, run))
    return fastest, flop


def op_shares(forward) -> dict[str, float]:
    """Each op kind's share of ``forward``'s self CPU time under the torch profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward()
    by_kind: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        name = event.key.removeprefix("aten::")
        kind = next((k for k, names in KINDS.items() if any(n in name for n in names)), "other")
        by_kind[kind] += event.self_cpu_time_total
    total = sum(by_kind.values()) or 1.0
    return {k: round(by_kind.get(k, 0.0) / total, 3) for k in (*KINDS, "other")}


def measure(name: str, folder: Path, texts: list[str], dtype: str, repeats: int) -> dict:
    enc = lw.Encoder(folder, device="cpu", model_dtype=dtype, max_length=512, concurrent_forwards=1)
    engine, packed = enc.engine, enc.engine.packed
    assert packed is not None, f"{name} does not run the packed forward"
    block = enc.inputs.encode_block(normalize_inputs(texts))
    layers = tuple(range(enc.n_hidden_states))
    batches = [np.asarray(b) for b in engine.plan_batches(block.lengths.tolist(), Call(layers), True)]
    prepared = [packed.prepare(block.columns(rows), with_token_types=engine.with_token_types, device=enc.device)
                for rows in batches]  # fmt: skip
    n_tokens = int(block.lengths.sum())
    row_counts = [int(block.lengths[rows].sum()) for rows in batches]
    run_gemms, gemm_flop = gemm_runner(linear_weights(enc.models.current), row_counts, DTYPES[dtype])

    def forward() -> int:
        with torch.inference_mode():
            for batch in prepared:
                packed.forward(batch, layers)
        return n_tokens

    def gemms() -> int:
        with torch.inference_mode():
            run_gemms()
        return n_tokens

    user = lw.Encoder(folder, device="cpu", model_dtype=dtype, max_length=512)  # its default streams

    def extract() -> int:
        user.extract(texts, layers="all", progress=False)
        return n_tokens

    forward(), extract()  # warm-up: oneDNN compiles its kernels for these row counts once
    # the machine's rate on either side of the rounds, the better kept: on a shared machine one
    # measurement can land in a neighbour's burst and make every ratio look better than it is
    before = best_matmul_rate(DTYPES[dtype])
    times = interleaved_times({"forward": forward, "gemms": gemms, "extract": extract}, repeats, n_tokens)
    median = {k: statistics.median(v) for k, v in times.items()}
    after = best_matmul_rate(DTYPES[dtype])
    machine = max(before, after)
    shares = op_shares(forward)
    report = {
        "texts": len(texts), "tokens": n_tokens, "batches": len(batches), "gemm_gflop": round(gemm_flop, 2),
        "seconds": {k: round(v, 4) for k, v in median.items()},
        "tokens_per_s": {k: round(n_tokens / v) for k, v in median.items()},
        "machine_gflops": round(machine, 1),
        "machine_gflops_before_after": [round(before, 1), round(after, 1)],
        "gemm_gflops": round(gemm_flop / median["gemms"], 1),
        "forward_gemm_gflops": round(gemm_flop / median["forward"], 1),
        "forward_over_gemms": round(median["gemms"] / median["forward"], 3),
        "forward_share_of_machine": round(gemm_flop / median["forward"] / machine, 3),
        "extract_share_of_machine": round(gemm_flop / median["extract"] / machine, 3),
        "extract_streams": user.engine.pool.forwards if user.engine.pool is not None else 1,
        "op_shares": shares,
        "rounds": {k: [round(t, 4) for t in v] for k, v in times.items()},
    }  # fmt: skip
    print(f"{name}, {dtype}: {n_tokens} tokens in {len(batches)} batches; machine {machine:.0f} GFLOP/s")
    print(
        f"  forward {median['forward']:.3f} s, its GEMMs alone {median['gemms']:.3f} s "
        f"({report['forward_over_gemms']:.0%} of the forward), extract {median['extract']:.3f} s"
    )
    print(
        f"  GEMM GFLOP/s: alone {report['gemm_gflops']}, in the forward {report['forward_gemm_gflops']} "
        f"({report['forward_share_of_machine']:.0%} of the machine), in extract "
        f"({report['extract_share_of_machine']:.0%})"
    )
    print("  op shares: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))  # fmt: skip
    return report


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--texts", type=int, default=400)
    args_parser.add_argument("--repeats", type=int, default=3)
    args_parser.add_argument("--dtypes", default="float32,bfloat16")
    args_parser.add_argument("--models", default="all-MiniLM-L6-v2,bert-base,llama-12x768")
    args_parser.add_argument("--output", type=Path, default=None, help="the result file (default: results/)")
    args = args_parser.parse_args()
    logging.getLogger("layerwise").setLevel(logging.ERROR)
    units = bf16_units()
    dtypes = [d for d in args.dtypes.split(",") if d == "float32" or units is not None]
    texts = mixed_corpus(args.texts, max(1, args.texts // 25))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; bfloat16 units: {units or 'none'}")
    report: dict = {"bf16_units": units, "dtypes": dtypes, "models": {}}
    with tempfile.TemporaryDirectory(prefix="lw-roof-") as base:
        folders = {"all-MiniLM-L6-v2": lambda: lw.default_model_path(), "bert-base": lambda: bert_base(Path(base)),
                   "llama-12x768": lambda: llama_folder(Path(base))}  # fmt: skip
        for name in args.models.split(","):
            folder = folders[name]()
            report["models"][name] = {
                dtype: measure(name, folder, texts, dtype, args.repeats) for dtype in dtypes
            }
    write_result("roof", report, args.output)


if __name__ == "__main__":
    main()
