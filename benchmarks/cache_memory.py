"""Peak memory of ``layerwise cache`` does not grow with the tokens cached.

    python benchmarks/cache_memory.py [--small 1000000] [--large 20000000]

A tiny random Llama (2 layers x 64, the default model's tokenizer) keeps the forward cheap, so
that what is measured is the cache's own machinery: the token pass, the permutation, the shards.
A synthetic corpus of single-token words holds enough tokens for the large run; each run is
``layerwise cache corpus.txt -o acts --model TINY --layers 1,2 --context 128 --tokens N`` in a fresh
process, timed with its peak RSS (ru_maxrss). The two peaks should be within 5 % of each other.
Results go to benchmarks/results/cache_memory.json.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import parser as common_parser  # noqa: E402
from common import timed_process, write_result  # noqa: E402

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but "
         "have an they you were her one all we can their has been there if more when will would who so no").split()  # fmt: skip


def tiny_llama(folder: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    import layerwise as lw

    tokenizer = AutoTokenizer.from_pretrained(lw.default_model_path())
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def corpus(path: Path, n_words: int) -> None:
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(n_words // 100 + 1):  # documents of 100 words
            handle.write(" ".join(rng.choices(WORDS, k=100)) + "\n")


def main() -> None:
    parser = common_parser(__doc__)
    parser.add_argument("--small", type=int, default=1_000_000)
    parser.add_argument("--large", type=int, default=20_000_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lw-cache-memory-"))
    try:
        model = tiny_llama(work / "tiny-llama")
        source = work / "corpus.txt"
        corpus(source, int(args.large * 1.1))
        runs = {}
        for n in (args.small, args.large):
            command = ["layerwise", "cache", str(source), "-o", str(work / f"acts{n}"), "--model", str(model),
                       "--layers", "1,2", "--context", "128", "--tokens", str(n), "-q"]  # fmt: skip
            seconds, rss_kib = timed_process(command)
            size = sum(p.stat().st_size for p in (work / f"acts{n}").iterdir() if p.is_file())
            runs[str(n)] = {"seconds": round(seconds, 1), "peak_rss_mib": round(rss_kib / 1024, 1),
                            "cache_gb": round(size / 1e9, 2)}  # fmt: skip
            print(
                f"{n:>11,} tokens: {seconds:6.1f} s, peak RSS {rss_kib / 1024:7.1f} MiB, {size / 1e9:.2f} GB on disk"
            )
            shutil.rmtree(work / f"acts{n}")
        ratio = runs[str(args.large)]["peak_rss_mib"] / runs[str(args.small)]["peak_rss_mib"]
        print(f"peak RSS, {args.large:,} vs {args.small:,} tokens: x{ratio:.3f}")
        write_result("cache_memory", {"command": "python benchmarks/cache_memory.py " + " ".join(sys.argv[1:]),
                                      "runs": runs, "rss_large_over_small": round(ratio, 4)})  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
