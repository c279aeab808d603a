"""Fuzz the alignment invariants with 10,000 random inputs (texts, pairs, pre-split words).

    python benchmarks/fuzz_alignment.py [--examples 10000] [--seed 0]

The invariants are those of tests/alignment_invariants.py (the CI suite runs a few hundred
derandomised examples of the same checks): one hidden row per token at every layer, offsets inside
the text and spelling the token's characters, word ids monotone within a segment, one word vector
per kept input word (zero vectors for words with no wordpiece), windowed == unwindowed for inputs
that fit. The default model runs with max_length=24 so that many inputs are truncated or windowed.
Prints the count per kind and any failure (hypothesis' shrunk example); exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from alignment_invariants import check_text, check_words, texts, words  # noqa: E402
from common import write_result  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402


def _runner(kind: str, encoder, configured, seed_value: int, calls: list[int]):
    """The hypothesis test for one kind of input; ``calls[0]`` counts the examples run."""
    if kind == "texts":

        @seed(seed_value)
        @configured
        @given(text=texts)
        def run(text):
            calls[0] += 1
            check_text(encoder, text)

    elif kind == "pairs":

        @seed(seed_value)
        @configured
        @given(text=texts, text_pair=texts)
        def run(text, text_pair):
            calls[0] += 1
            check_text(encoder, text, text_pair)

    else:

        @seed(seed_value)
        @configured
        @given(word_list=words)
        def run(word_list):
            calls[0] += 1
            check_words(encoder, word_list)

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="Write the results here instead")
    args = parser.parse_args()
    logging.getLogger("layerwise").setLevel(logging.ERROR)  # truncation warnings on every example

    import layerwise as lw

    encoder = lw.Encoder(device="cpu", max_length=24)
    shares = {"texts": 0.4, "pairs": 0.3, "words": 0.3}
    report: dict = {"examples": {}, "failures": [], "model": encoder.name, "max_length": 24}
    started = time.perf_counter()
    for kind, share in shares.items():
        calls = [0]
        configured = settings(
            max_examples=round(args.examples * share),
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        run = _runner(kind, encoder, configured, args.seed, calls)
        try:
            run()
            status = "ok"
        except Exception as exc:  # hypothesis re-raises the shrunk failing example
            status = "FAILED"
            report["failures"].append({"kind": kind, "error": f"{type(exc).__name__}: {exc}"[:4000]})
        report["examples"][kind] = calls[0]
        print(f"{kind:6s} {calls[0]:6,d} examples  {status}", flush=True)
    report["seconds"] = round(time.perf_counter() - started, 1)
    total = sum(report["examples"].values())
    print(f"{total:,} examples in {report['seconds']:.0f} s, {len(report['failures'])} failure(s)")
    for failure in report["failures"]:
        print(f"--- {failure['kind']}\n{failure['error']}")
    write_result("fuzz_alignment", report, args.json)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
