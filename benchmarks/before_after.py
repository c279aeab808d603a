"""Two commits' code on the same models, rounds interleaved: is the forward at HEAD as fast as before?

    python benchmarks/before_after.py --before a2ea62a [--after HEAD] [--rounds 5] [--sentences 120]

Each commit's code is a git worktree, put first on PYTHONPATH of a fresh process per round and case:
the process loads the model, extracts once to warm up, then times three extractions of every hidden
state of every token of UD EWT sentences and keeps the fastest. Rounds alternate the commits (before, after, before, …),
so a slow spell of this shared machine hits both alike; medians are compared. Cases: the packed
decoders at a 12 x 768 shape (family_speed.py's models: GPT-NeoX, OPT, Phi, OLMo 2, and Llama and
Qwen 3 with grouped-query attention), two concurrent forwards (Qwen 3), the streamed forward
(Llama), BERT-base packed (packed_speed.py's shape) and BERT-base on the general path
(transformers' own padded forward). Each process's peak resident memory is kept too. Target (issue:
one forward): every case within 3 % of before, or faster; the streamed forward's peak memory no
higher.

Result: benchmarks/results/before_after.json (each case's seconds per round, medians, after/before,
and the commit its "after" ran at: ``--keep`` reruns some cases and keeps the others).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))
from common import copy_default_tokenizer, mixed_corpus, parser, read_result, write_result  # noqa: E402

LIMIT = 1.03  # after / before, at most
# case -> (model, Encoder options)
CASES: dict[str, tuple[str, dict]] = {
    "gpt_neox": ("gpt_neox", {}),
    "opt": ("opt", {}),
    "phi": ("phi", {}),
    "olmo2": ("olmo2", {}),
    "llama": ("llama", {}),
    "qwen3": ("qwen3", {}),
    # streams: concurrent_forwards' earlier name, the one both commits know (a warning at HEAD)
    "qwen3-two-forwards": ("qwen3", {"streams": 2}),
    "llama-streamed": ("llama", {"streaming": True}),
    "bert-base": ("bert", {}),
    "bert-base-general": ("bert", {"packed": False}),
}
# run by each commit's code: the seconds of an extraction after a warm-up, the best of three
TIME = """
import json, resource, sys, time
import layerwise as lw
folder, options, texts = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
encoder = lw.Encoder(folder, device="cpu", max_length=512, **options)
encoder.extract(texts[:16], layers="all", progress=False)
best = float("inf")
for _ in range(3):  # the best of three: a spell of this shared machine's other work is not the code's
    start = time.perf_counter()
    tokens = sum(s.n_tokens for s in encoder.extract(texts, layers="all", progress=False))
    best = min(best, time.perf_counter() - start)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux reports KiB)
print(json.dumps({"seconds": best, "tokens": tokens, "path": encoder.run_path, "peak_mib": peak}))
"""


def build(model: str, folder: Path) -> Path:
    """A random 12 x 768 model of ``model`` with its tokenizer kind (BERT-base: the default model's
    WordPiece), saved to ``folder``."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    if model == "bert":
        BertModel(BertConfig()).save_pretrained(folder)
        return copy_default_tokenizer(folder)
    from family_speed import SHAPE
    from family_speed import family_folder as built

    if model in ("gpt_neox", "opt", "phi", "olmo2"):
        made = built(model)
        shutil.copytree(made, folder)
        shutil.rmtree(made, ignore_errors=True)
        return folder
    from decoder_models import byte_level_tokenizer, decoder_config, sentencepiece_tokenizer
    from transformers import AutoModelForCausalLM

    tokenizer = byte_level_tokenizer() if model == "qwen3" else sentencepiece_tokenizer()
    tokenizer.model_max_length = 512
    config = decoder_config(model, tokenizer, SHAPE["num_hidden_layers"])
    for field, value in {
        **SHAPE,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "max_position_embeddings": 512,
    }.items():
        setattr(config, field, value)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def timed(tree: Path, folder: Path, options: dict, texts: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-c", TIME, str(folder), json.dumps(options), json.dumps(texts)]
    out = subprocess.run(command, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{tree.name}: {options} on {folder.name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--before", required=True)
    args.add_argument("--after", default="HEAD")
    args.add_argument("--rounds", type=int, default=5)
    args.add_argument("--sentences", type=int, default=120)
    args.add_argument("--cases", default=",".join(CASES))
    args.add_argument(
        "--keep", action="store_true", help="keep the result file's other cases (same --before)"
    )
    given = args.parse_args()
    texts = mixed_corpus(given.sentences, 0)
    cases = {name: CASES[name] for name in given.cases.split(",")}
    report: dict = {"before": given.before, "after": given.after, "sentences": len(texts), "cases": {}}
    kept = read_result("before_after") if given.keep else {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trees = {}
        for side in ("before", "after"):
            commit = getattr(given, side)
            trees[side] = work / side
            subprocess.run(
                ["git", "worktree", "add", "-q", "--detach", str(trees[side]), commit], cwd=REPO, check=True
            )
            sha = subprocess.run(
                ["git", "rev-parse", "--short", commit], cwd=REPO, capture_output=True, text=True
            )
            report[side] = sha.stdout.strip()
        try:
            folders = {m: build(m, work / "models" / m) for m in {model for model, _ in cases.values()}}
            for name, (model, options) in cases.items():
                seconds: dict[str, list[float]] = {"before": [], "after": []}
                peaks: dict[str, list[float]] = {"before": [], "after": []}
                for _ in range(given.rounds):
                    for side in ("before", "after"):
                        run = timed(trees[side], folders[model], options, texts)
                        seconds[side].append(run["seconds"])
                        peaks[side].append(round(run["peak_mib"], 1))
                median = {side: statistics.median(s) for side, s in seconds.items()}
                peak = {side: statistics.median(p) for side, p in peaks.items()}
                ratio = median["after"] / median["before"]
                report["cases"][name] = {
                    "path": run["path"],
                    "tokens": run["tokens"],
                    "seconds": seconds,
                    "median_seconds": median,
                    "after_over_before": round(ratio, 4),
                    "within_limit": ratio <= LIMIT,
                    "peak_mib": peaks,
                    "median_peak_mib": peak,
                    "peak_after_over_before": round(peak["after"] / peak["before"], 4),
                    "after": report["after"],  # the commit this case's "after" ran at
                }
                verdict = "ok" if ratio <= LIMIT else "SLOWER"
                line = f"{name:20s} {run['path']:9s} before {median['before']:.3f} s  after {median['after']:.3f} s"
                memory = f"peak {peak['before']:.0f} -> {peak['after']:.0f} MiB"
                print(f"{line}  after/before {ratio:.3f}  {verdict}  {memory}", flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
    write_result("before_after", merged(kept, report) if kept else report)


def merged(kept: dict, report: dict) -> dict:
    """``report`` with the cases of an earlier run against the same commit, each case keeping the
    commit its "after" ran at."""
    if kept["before"] != report["before"] or kept["sentences"] != report["sentences"]:
        raise SystemExit("--keep: the result file compares another commit or corpus; run every case")
    earlier = {
        name: {**case, "after": case.get("after", kept["after"])} for name, case in kept["cases"].items()
    }
    return {**report, "cases": {**earlier, **report["cases"]}}


if __name__ == "__main__":
    main()
