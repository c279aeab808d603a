"""The UPOS probe on UD English EWT with the default model: per-layer curve, fusions, scalar mix,
random-model control and control task, in one run.

    python benchmarks/probe_ud_ewt.py [--max-train 3000]

Equivalent to ``layerwise probe conllu --train en_ewt-ud-train.conllu --dev en_ewt-ud-dev.conllu
--max-train 3000 --json ... --plot ...``. Writes benchmarks/results/probe_ud_ewt.json and
docs/images/probe_ud_ewt.png (shown in the probing guide) and checks the shape of the curve the
literature reports: best in the lower-middle layers, the last layer clearly below the best, every
layer well above the random-model control.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import figure_path, result_path, upos_conllu, write_result  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-train", type=int, default=3000)
    args = parser.parse_args()
    from rich.console import Console

    import layerwise as lw

    started = time.perf_counter()
    result = lw.probe(
        "conllu",
        train=upos_conllu("train"),
        dev=upos_conllu("dev"),
        column="upos",
        max_train=args.max_train,
        progress=False,
    )
    seconds = time.perf_counter() - started
    Console(width=110).print(result.table())
    result.to_json(result_path("probe_ud_ewt"))  # the probe's own format, then the machine beside it
    write_result("probe_ud_ewt", json.loads(result_path("probe_ud_ewt").read_text(encoding="utf-8")))
    result.plot(figure_path("probe_ud_ewt.png"))
    layers = result.layer_rows()
    best = max(layers, key=lambda r: r.score)
    last = layers[-1]
    n = len(layers) - 1
    print(f"total {seconds / 60:.1f} min on {os.cpu_count()} cores")
    print(
        f"best layer L{best.layers[0]} of 0..{n}: {'lower-middle' if 1 <= best.layers[0] <= n // 2 + 1 else 'NOT lower-middle'}"
    )
    print(
        f"last layer {100 * last.score:.1f} vs best {100 * best.score:.1f}: {100 * (best.score - last.score):.1f} points below"
    )
    margin = min(r.score - (r.random_model or 0) for r in layers)
    print(f"smallest margin over the random-model control: {100 * margin:.1f} points")


if __name__ == "__main__":
    main()
