"""What a whole command costs beyond its work: ``layerwise extract`` of one line against the import of
torch and transformers alone, each in a fresh process.

    python benchmarks/start_cost.py [--rounds 5]

Interleaved rounds, medians, each a new Python process with bytecode caching on (as an installed
package runs; the first round of each is a warm-up):

- ``import``: ``python -c "import torch, transformers"``: the floor any command of the field pays;
- ``registry``: the same, then ``from transformers import AutoConfig, AutoTokenizer``: transformers
  builds the import table of every model it knows the first time anything under
  ``transformers.models`` is imported, which loading any config or tokenizer does;
- ``extract``: ``layerwise extract one.txt -o one.npz`` on the default model: the command line, the
  model and its tokenizer loaded and checked, one line extracted and written with its metadata.

The target (issue 64): ``extract`` within 1.2x ``import``. Results: benchmarks/results/start_cost.json.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import parser, write_result

TARGET = 1.2


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--rounds", type=int, default=5)
    args_parser.add_argument("--output", type=Path, default=None, help="the result file (default: results/)")
    args = args_parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lw-start-"))
    (work / "one.txt").write_text("The bank raised rates.\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as installed code runs
    commands = {
        "import": [sys.executable, "-c", "import torch, transformers"],
        "registry": [sys.executable, "-c", "import torch, transformers\nfrom transformers import AutoConfig, AutoTokenizer"],
        "extract": [sys.executable, "-m", "layerwise", "extract", str(work / "one.txt"), "-o", str(work / "one.npz")],
    }  # fmt: skip
    seconds: dict[str, list[float]] = {k: [] for k in commands}
    for round_ in range(args.rounds + 1):
        for key, command in commands.items():
            (work / "one.npz").unlink(missing_ok=True)
            started = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, env=env, cwd=work)
            if round_:  # the first round warms the page cache and writes the bytecode
                seconds[key].append(time.perf_counter() - started)
    median = {k: statistics.median(v) for k, v in seconds.items()}
    ratio = median["extract"] / median["import"]
    for key, value in median.items():
        print(f"{key:9s} {value:.2f} s  ({value / median['import']:.2f}x the import)")
    print(f"a whole one-line extract: {ratio:.2f}x the import of torch and transformers (target <= {TARGET})")
    write_result("start_cost", {
        "rounds": args.rounds, "median_s": {k: round(v, 3) for k, v in median.items()},
        "extract_over_import": round(ratio, 3), "registry_over_import": round(median["registry"] / median["import"], 3),
        "target": TARGET, "seconds": {k: [round(t, 3) for t in v] for k, v in seconds.items()},
    }, args.output)  # fmt: skip


if __name__ == "__main__":
    main()
