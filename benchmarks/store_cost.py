"""The store's own cost: ``extract_to_store`` against in-memory ``extract`` of the same texts.

    python benchmarks/store_cost.py [--rounds 5] [--copies 1 4]

Every hidden state of every token of the default model (float16 on disk, max_length 512) on the
corpus of benchmarks/store_speed.py: 2,000 UD EWT sentences and 50 documents. In-memory ``extract``
and ``extract_to_store`` alternate, ``--rounds`` rounds; the ratio is best over best and median over
median (target <= 1.05).

Each run is a fresh process that loads the model, warms up on 16 texts by the path it times (the
store's imports included: 0.2-0.3 s once per process, not per text) and times the one call, so that
no run inherits the heap of another (in one process, whichever runs after in-memory ``extract``
pays to fault in again the 0.7 GB of results it freed). The writers give free heap pages back at
most every ``TRIM_EVERY_S`` = 10 s (src/layerwise/_host/memory.py): a one-copy run (about 8 s) holds no
trim; ``--copies 4`` runs the corpus four times over in every run (about 30 s), so that trims fall
inside it as in a long run (the in-memory run then holds 2.8 GB of results).
Results: benchmarks/results/store_cost.json.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import mixed_corpus, parser, write_result  # noqa: E402


def one_run(kind: str, copies: int, sentences: int, documents: int) -> float:
    """Seconds of one ``extract`` or ``extract_to_store`` call in this (fresh) process."""
    import layerwise as lw

    logging.getLogger("layerwise").setLevel(logging.ERROR)  # the truncation warning, once per run
    texts = mixed_corpus(sentences, documents) * copies
    encoder = lw.Encoder(device="cpu", max_length=512)
    work = Path(tempfile.mkdtemp(prefix="lw-store-cost-"))
    try:
        # warm-up on 16 texts, each by its own path: oneDNN's kernels, the allocator's pools, and for
        # the store its imports (zarr, pyarrow: 0.2-0.3 s, once per process, not per text)
        if kind == "extract":
            encoder.extract(texts[:16], progress=False)
        else:
            lw.extract_to_store(encoder, texts[:16], work / "warm.lw", progress=False)
        started = time.perf_counter()
        if kind == "extract":
            encoder.extract(texts, progress=False)
        else:
            lw.extract_to_store(encoder, texts, work / "cost.lw", progress=False)
        return time.perf_counter() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)


def store_cost(copies: int, rounds: int, sentences: int = 2000, documents: int = 50) -> dict:
    """Alternating in-memory and store runs, each in its own process: seconds and the two ratios."""
    times: dict[str, list[float]] = {"extract": [], "extract_to_store": []}
    for _ in range(rounds):
        for kind in times:
            command = [sys.executable, __file__, "--one", kind, "--copies", str(copies),
                       "--sentences", str(sentences), "--documents", str(documents)]  # fmt: skip
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            times[kind].append(float(out.split()[-1]))
    in_memory, to_store = times["extract"], times["extract_to_store"]
    return {
        "extract_s": [round(t, 3) for t in in_memory],
        "extract_to_store_s": [round(t, 3) for t in to_store],
        "ratio_best": round(min(to_store) / min(in_memory), 4),
        "ratio_median": round(statistics.median(to_store) / statistics.median(in_memory), 4),
    }


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--rounds", type=int, default=5)
    args.add_argument(
        "--copies", type=int, nargs="+", default=[1, 4], help="the corpus this many times per run"
    )
    args.add_argument("--sentences", type=int, default=2000)
    args.add_argument("--documents", type=int, default=50)
    args.add_argument("--one", choices=("extract", "extract_to_store"), help=argparse.SUPPRESS)
    options = args.parse_args()
    if options.one:  # a run in its own process (what main starts)
        print(one_run(options.one, options.copies[0], options.sentences, options.documents))
        return

    from layerwise._host.memory import TRIM_EVERY_S

    report: dict = {"rounds": options.rounds, "trim_every_s": TRIM_EVERY_S}
    for copies in options.copies:
        result = store_cost(copies, options.rounds, options.sentences, options.documents)
        report[f"copies_{copies}"] = result
        print(f"x{copies}: extract {result['extract_s']} s, extract_to_store {result['extract_to_store_s']} s"
              f" -> store/in-memory {result['ratio_best']:.3f} best, {result['ratio_median']:.3f} median"
              " (target <= 1.05)")  # fmt: skip
    write_result("store_cost", report)


if __name__ == "__main__":
    main()
