"""The sweep's counts: every type of transformers' masked-LM, causal-LM and sequence-to-sequence
mappings, built tiny and random (tests/sweep_models.py), loaded by layerwise and compared with
transformers' ``output_hidden_states`` of each text alone, by both methods. The counts by outcome
(equal, refused by reason, skipped because transformers cannot build or run the type with generic
settings, wrong) are what docs/models.md shows; tests/test_sweep.py holds the same outcomes as a test.

    python benchmarks/family_sweep.py [--types llama,t5] [--workers 2]

Results: benchmarks/results/family_sweep.json.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from common import parser, write_result  # noqa: E402


def _one(model_type: str) -> dict[str, Any]:
    """One type in a worker of its own thread: a crash is the type's outcome, not the run's end."""
    import sweep_models
    import torch

    torch.set_num_threads(1)
    if not hasattr(sweep_models.tokenizer_for, "cache_info"):  # one tokenizer per kind per worker
        sweep_models.tokenizer_for = functools.cache(sweep_models.tokenizer_for)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            return sweep_models.sweep_one(model_type, Path(tmp) / model_type)
        except Exception as exc:  # a traceback: counted, and named with its message
            return {"type": model_type, "outcome": "traceback", "why": f"{type(exc).__name__}: {exc}"[:300]}


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--types", default="", help="comma-separated model types (default: every one)")
    args.add_argument("--workers", type=int, default=2)
    given = args.parse_args()
    import transformers
    from sweep_models import swept_types

    types = [t for t in given.types.split(",") if t] or swept_types()
    start = time.perf_counter()
    with ProcessPoolExecutor(given.workers) as pool:
        results = list(pool.map(_one, types))
    outcomes = Counter(r["outcome"] for r in results)
    refusals = Counter(r.get("reason") for r in results if r["outcome"] == "refused")
    paths = Counter(r.get("path") for r in results if r["outcome"] == "equal")
    failures = [r for r in results if r["outcome"] not in ("equal", "refused", "skipped", "media")]
    print(dict(outcomes), dict(refusals))
    for failure in failures:
        print("FAILED", failure)
    write_result(
        "family_sweep",
        {
            "transformers": transformers.__version__,
            "types": len(types),
            "outcomes": dict(outcomes),
            "equal_by_path": dict(paths),
            "refusals": dict(refusals),
            "skipped": {r["type"]: r["why"] for r in results if r["outcome"] == "skipped"},
            "failures": failures,
            "seconds": round(time.perf_counter() - start, 1),
        },
    )


if __name__ == "__main__":
    main()
