"""On a CUDA GPU: where the time of a call goes, and which batch size fills the device.

    python benchmarks/gpu_profile.py [--out FOLDER] [--sentences 2000] [--documents 50]

BERT-base shape (random weights, the default model's tokenizer), float16, the mixed UD EWT corpus
of gpu_speed.py. Prints, and writes as pstats files under ``--out``:

- a whole ``layerwise extract`` process on a one-line corpus under cProfile (``cli.prof``; its
  ``-X importtime`` log too), beside ``python -c "import torch"`` with CUDA's set-up;
- a fresh Encoder made (``make.prof``), its first ``embed(layers="all")`` and its second
  (``first.prof``, ``second.prof``), an embed of other batches, extract float16 twice;
- ``extract_to_store`` of every layer (``store.prof``: the main thread; the writer's thread is not
  profiled) and again;
- embed and extract float16 at batch sizes 128 .. 4096 and token budgets 32,768 .. 131,072
  (medians of 3 after a warm-up): what the GPU default (``encoder/core.py``) was chosen from.

``--device cpu`` with a few texts is a dry run of the script, not a figure.
"""

from __future__ import annotations

import cProfile
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from common import bert_base_folder, mixed_corpus, parser

import layerwise as lw

SIZES = [(128, 32768), (512, 32768), (1024, 65536), (4096, 65536), (4096, 131072)]


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "gpu_profile")
    args.add_argument("--sentences", type=int, default=2000)
    args.add_argument("--documents", type=int, default=50)
    args.add_argument("--device", default="cuda")
    opts = args.parse_args()
    out, device = opts.out, opts.device
    out.mkdir(parents=True, exist_ok=True)
    texts = mixed_corpus(opts.sentences, opts.documents)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def timed(name: str, fn, prof: str | None = None):
        sync()
        started = time.perf_counter()
        profile = cProfile.Profile() if prof else None
        if profile:
            profile.enable()
        result = fn()
        sync()
        if profile:
            profile.disable()
            profile.dump_stats(out / f"{prof}.prof")
        print(f"{name}: {time.perf_counter() - started:.3f} s", flush=True)
        return result

    with bert_base_folder() as base:
        work = Path(tempfile.mkdtemp(prefix="lw-gpu-profile-"))
        one = work / "one.txt"
        one.write_text("A single line of text.\n", encoding="utf-8")
        command = [sys.executable, "-X", "importtime", "-m", "cProfile", "-o", str(out / "cli.prof"), "-m",
                   "layerwise", "extract", str(one), "-o", str(work / "o.npz"), "--model", str(base),
                   "--device", device, "--model-dtype", "float16", "--layers", "all"]  # fmt: skip
        with open(out / "importtime.log", "w", encoding="utf-8") as log:
            timed("a whole `layerwise extract` on one line, under cProfile", lambda: subprocess.run(
                command, stderr=log, check=True))  # fmt: skip
        cuda_init = f"import torch; torch.zeros(1, device={device!r})"
        timed("python, import torch, the device's set-up", lambda: subprocess.run(
            [sys.executable, "-c", cuda_init], check=True))  # fmt: skip
        _profile_calls(base, texts, device, work, timed)
        for batch_size, max_tokens in SIZES:
            sized = lw.Encoder(base, device=device, model_dtype="float16", max_length=512,
                               batch_size=batch_size, max_tokens=max_tokens)  # fmt: skip
            calls = {"embed": lambda sized=sized: sized.embed(texts, layers="all", pool="mean", progress=False),
                     "extract float16": lambda sized=sized: sized.extract(texts, layers="all", dtype="float16",
                                                              progress=False)}  # fmt: skip
            medians = {}
            for name, call in calls.items():
                call()
                seconds = []
                for _ in range(3):
                    sync()
                    started = time.perf_counter()
                    call()
                    sync()
                    seconds.append(time.perf_counter() - started)
                medians[name] = round(statistics.median(seconds), 3)
            print(f"batch_size {batch_size}, max_tokens {max_tokens}: seconds {medians}", flush=True)
            del sized
        shutil.rmtree(work, ignore_errors=True)
    print(f"profiles in {out} (python -m pstats FILE)")


def _profile_calls(base: Path, texts: list[str], device: str, work: Path, timed) -> None:
    """A fresh Encoder's calls, profiled (the Encoder is freed on return, before the sweep)."""
    enc = timed("Encoder made", lambda: lw.Encoder(base, device=device, model_dtype="float16",
                                                   max_length=512), "make")  # fmt: skip
    embed = lambda items: enc.embed(items, layers="all", pool="mean", progress=False)  # noqa: E731
    timed("first embed", lambda: embed(texts), "first")
    timed("second embed", lambda: embed(texts), "second")
    timed("embed of other batches", lambda: embed((texts[::-1][:1000] + texts[1000:])[::2]))
    for name in ("first extract float16", "second extract float16"):
        timed(name, lambda: enc.extract(texts, layers="all", dtype="float16", progress=False))
    lw.extract_to_store(enc, texts[:64], work / "warm.lw", progress=False)
    timed(
        "extract_to_store",
        lambda: lw.extract_to_store(enc, texts, work / "s.lw", progress=False),
        "store",
    )
    shutil.rmtree(work / "s.lw")
    timed("extract_to_store again", lambda: lw.extract_to_store(enc, texts, work / "s.lw", progress=False))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
