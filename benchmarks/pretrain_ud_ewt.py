"""Pretraining a small BERT from scratch on UD English EWT documents (train split), on CPU.

    python benchmarks/pretrain_ud_ewt.py [--steps 2500] [--layers 2] [--hidden 128]

Writes the corpus (one sentence per line, blank line between documents), runs
``layerwise pretrain`` as a user would, then loads the saved folder with ``layerwise.Encoder``
and extracts every layer of a sentence. Held-out documents give the MLM accuracy (against the
most-frequent-token baseline on the same positions) and the NSP accuracy (against 50 %).
Results go to benchmarks/results/pretrain_ud_ewt.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import read_documents, write_result  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lw-pretrain-"))
    try:
        corpus = work / "ud_ewt_train_docs.txt"
        corpus.write_text(
            "\n\n".join("\n".join(doc) for doc in read_documents("train")) + "\n", encoding="utf-8"
        )
        out = work / "tiny-bert"
        command = ["layerwise", "pretrain", str(corpus), "-o", str(out), "--layers", str(args.layers),
                   "--hidden", str(args.hidden), "--heads", str(args.heads), "--steps", str(args.steps),
                   "--max-length", str(args.max_length), "--vocab-size", "8000",
                   "--learning-rate", str(args.learning_rate), "--eval-fraction", "0.1", "-q"]  # fmt: skip
        started = time.perf_counter()
        subprocess.run(command, check=True)
        seconds = time.perf_counter() - started
        log = json.loads((out / "pretraining_log.json").read_text())
        import layerwise as lw

        enc = lw.Encoder(out, device="cpu")
        stack = enc.extract(["The bank raised interest rates again."])[0]
        held = log["held_out"]
        print(f"{args.steps} steps, {args.layers} layers x {args.hidden}, in {seconds / 60:.1f} min")
        print(
            f"held-out MLM accuracy {held['mlm_accuracy']:.1%} vs most-frequent-token baseline {held['mlm_baseline']:.1%}"
        )
        print(f"held-out NSP accuracy {held['nsp_accuracy']:.1%} vs 50%")
        print(f"Encoder loads it: {enc}; extract -> {stack.hidden.shape} for tokens {stack.tokens}")
        write_result("pretrain_ud_ewt", {
            "settings": log["settings"], "examples": log["examples"], "documents": log["documents"],
            "held_out": held, "minutes": round(seconds / 60, 2), "extract_shape": list(stack.hidden.shape),
            "curve": log["log"],
        })  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
