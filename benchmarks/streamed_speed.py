"""Layer-streamed extraction against the in-memory forward of the same model, on the CPU: speed on
large blocks, the memory a streamed run takes, and the cost model behind both.

    python benchmarks/streamed_speed.py [--hidden 512] [--layers 8] [--sentences 1600] [--repeats 3]

The model: random weights (seed 0) in the Llama shape (``--hidden`` wide, ``--layers`` deep, a
feed-forward 8/3 as wide, 64-wide heads), saved as safetensors, with the default model's WordPiece
tokenizer (30,522 tokens: the shapes matter here, not the words). The corpus: UD EWT train
sentences and documents (``common.mixed_corpus``), at least 32,768 tokens.

**Speed** (one process, interleaved rounds, medians): ``enc.embed(texts, layers="all")`` with the
model in memory, and streamed (``streaming=True``, one block for the whole corpus), its weights read
from the page cache. Target (issue 67): streamed >= 0.8x in memory.

**Memory** (fresh processes under ``/usr/bin/time -v``): each imports torch, transformers and
layerwise and reads the corpus, records its resident size, then loads the model and runs the same
``embed``. The growth is the peak minus that size. The streamed run has ``max_device_memory`` = a
quarter of the weights. Its bound: two units' weights + the block's activations (its tokens x the
per-token bytes it was chosen from, and one batch's working activations) + 300 MB.

**Cost model**: the bytes read per block (every weight once; the word table only for the block's
ids) against the block's FLOPs (2 x the layers' parameters per token). This machine's disk or page
cache rate and its matmul rate give the time of each.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    copy_default_tokenizer,
    interleaved_times,
    matmul_gflops,
    mixed_corpus,
    parser,
    rss_kib,
    write_result,
)

import layerwise as lw

TARGET_SPEED = 0.8
SLACK_MB = 300


def llama_folder(folder: Path, hidden: int, layers: int) -> Path:
    """A random Llama-shaped model (seed 0) with the default model's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    inner = int(hidden * 8 / 3) // 64 * 64
    config = LlamaConfig(vocab_size=30522, hidden_size=hidden, intermediate_size=inner, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                         max_position_embeddings=512, pad_token_id=0, bos_token_id=101, eos_token_id=102)  # fmt: skip
    LlamaModel(config).save_pretrained(folder)
    return copy_default_tokenizer(folder)


def weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def child(mode: str, folder: str, n_sentences: int, n_documents: int, budget: str) -> None:
    """One measured run in this fresh process; its numbers on the last line of stdout."""
    import torch  # noqa: F401  (imported before the baseline, as any run imports it)
    import transformers  # noqa: F401

    texts = mixed_corpus(n_sentences, n_documents)
    baseline = rss_kib(os.getpid())
    options = {"streaming": True, "max_device_memory": budget} if mode == "streamed" else {}
    enc = lw.Encoder(folder, device="cpu", **options)
    started = time.perf_counter()
    enc.embed(texts, layers="all", progress=False)
    report = {"baseline_kib": baseline, "seconds": time.perf_counter() - started}
    if mode == "streamed":  # the sizes the block was chosen from (_model/streaming/plan.py)
        forward = enc.engine.streamed
        shape, plan = forward.model.shape(), forward.plan
        report.update(
            block_tokens=plan.block_tokens, batch_tokens=plan.batch_tokens, two_units_bytes=shape.weights,
            streams=plan.forwards,
            activation_bytes=plan.block_tokens * 2 * shape.state + plan.batch_tokens * shape.work * plan.forwards,
            peak_resident_units=forward.model.peak_resident,
        )  # fmt: skip
    print(json.dumps(report))


def measured(mode: str, folder: Path, args, budget: str) -> dict:
    command = ["/usr/bin/time", "-v", sys.executable, __file__, "--child", mode, str(folder),
               "--sentences", str(args.sentences), "--documents", str(args.documents), "--budget", budget]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:  # the child's own error, not only its exit status
        raise SystemExit(f"the {mode} child failed ({run.returncode}):\n{run.stderr[-3000:]}")
    report = json.loads(run.stdout.strip().splitlines()[-1])
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr)
    assert peak is not None, run.stderr[-500:]
    report["peak_kib"] = int(peak.group(1))
    report["growth_mb"] = round((report["peak_kib"] - report["baseline_kib"]) / 1024, 1)
    return report


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--hidden", type=int, default=512)
    args_parser.add_argument("--layers", type=int, default=8)
    args_parser.add_argument("--sentences", type=int, default=1600)
    args_parser.add_argument("--documents", type=int, default=10)
    args_parser.add_argument("--repeats", type=int, default=3)
    args_parser.add_argument("--child", nargs=2, metavar=("MODE", "FOLDER"), help=argparse.SUPPRESS)
    args_parser.add_argument("--budget", default="", help=argparse.SUPPRESS)
    args_parser.add_argument("--output", type=Path, default=None, help="the result file (default: results/)")
    args = args_parser.parse_args()
    logging.getLogger("layerwise").setLevel(logging.ERROR)  # the documents' truncation warning
    if args.child:
        child(args.child[0], args.child[1], args.sentences, args.documents, args.budget)
        return
    folder = Path(tempfile.mkdtemp(prefix="lw-streamed-"))
    try:
        report = run(llama_folder(folder, args.hidden, args.layers), args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    write_result("streamed_speed", report, args.output)


def run(folder: Path, args) -> dict:
    texts = mixed_corpus(args.sentences, args.documents)
    memory = lw.Encoder(folder, device="cpu")
    n_tokens = sum(len(e.ids) for e in memory.inputs.capped_tokenizer().encode_batch(texts))
    streamed = lw.Encoder(folder, device="cpu", streaming=True, stream_block_tokens=max(32768, n_tokens))
    contenders = {
        "memory": lambda: (memory.embed(texts, layers="all", progress=False), n_tokens)[1],
        "streamed": lambda: (streamed.embed(texts, layers="all", progress=False), n_tokens)[1],
    }
    for fn in contenders.values():  # warm-up: the page cache holds the weights from here on
        fn()
    times = interleaved_times(contenders, args.repeats, n_tokens)
    median = {k: statistics.median(v) for k, v in times.items()}
    ratio = median["memory"] / median["streamed"]
    weights = weights_bytes(folder)
    config = memory.config
    layer_params = sum(p.numel() for p in memory.models.current.layers[0].parameters())
    flop_per_token = 2 * layer_params * config.num_hidden_layers
    gflops = matmul_gflops()
    read_start = time.perf_counter()
    for path in folder.glob("*.safetensors"):
        path.read_bytes()  # from the page cache, as the streamed runs read it
    read_seconds = time.perf_counter() - read_start
    print(f"{len(texts)} texts, {n_tokens} tokens in one block; weights {weights / 1e6:.0f} MB")
    for key, seconds in median.items():
        print(f"{key:9s} {seconds:.2f} s  {n_tokens / seconds:>9,.0f} tok/s")
    print(f"streamed runs {ratio:.2f}x the in-memory forward (target >= {TARGET_SPEED}x)")
    print(f"cost model per block: {weights / 1e6:.0f} MB read ({read_seconds:.2f} s from the page cache here) "
          f"against {flop_per_token * n_tokens / 1e12:.2f} TFLOP ({flop_per_token * n_tokens / gflops / 1e9:.1f} s "
          f"at this machine's {gflops:.0f} GFLOP/s)")  # fmt: skip
    budget = f"{weights // 4}"
    memory_runs = {mode: measured(mode, folder, args, budget) for mode in ("memory", "streamed")}
    s = memory_runs["streamed"]
    bound_mb = (s["two_units_bytes"] + s["activation_bytes"]) / 2**20 + SLACK_MB
    print(f"memory: in memory +{memory_runs['memory']['growth_mb']} MB; streamed with a budget of a quarter of the "
          f"weights ({int(budget) / 2**20:.0f} MiB, blocks of {s['block_tokens']} tokens) +{s['growth_mb']} MB, "
          f"bound {bound_mb:.0f} MB (two units' weights + the block's activations + {SLACK_MB} MB)")  # fmt: skip
    return {
        "model": {"shape": "llama", "hidden_size": config.hidden_size, "layers": config.num_hidden_layers,
                  "intermediate_size": config.intermediate_size, "weights_bytes": weights},
        "texts": len(texts), "tokens": n_tokens, "repeats": args.repeats,
        "seconds": {k: round(v, 3) for k, v in median.items()},
        "tokens_per_s": {k: round(n_tokens / v) for k, v in median.items()},
        "streamed_over_memory": round(ratio, 3), "target": TARGET_SPEED,
        "rounds": {k: [round(t, 3) for t in v] for k, v in times.items()},
        "cost_model": {"bytes_read_per_block": weights, "page_cache_read_s": round(read_seconds, 3),
                       "flop_per_block": flop_per_token * n_tokens, "matmul_gflops": round(gflops, 1)},
        "memory": {"budget_bytes": int(budget), "runs": memory_runs, "bound_mb": round(bound_mb, 1), "slack_mb": SLACK_MB,
                   "held": s["growth_mb"] <= bound_mb},
        "held": {"speed": ratio >= TARGET_SPEED, "memory": s["growth_mb"] <= bound_mb},
    }  # fmt: skip


if __name__ == "__main__":
    main()
