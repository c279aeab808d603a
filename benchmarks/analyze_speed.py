"""Time of ``layerwise analyze`` on 500 UD EWT dev sentences with the default model (target < 1 min).

python benchmarks/analyze_speed.py [--sentences 500]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import figure_path, read_documents, write_result  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", type=int, default=500)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lw-analyze-"))
    try:
        sentences = [s for doc in read_documents("dev") for s in doc][: args.sentences]
        (work / "texts.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
        started = time.perf_counter()
        subprocess.run(
            ["layerwise", "analyze", str(work / "texts.txt"), "-o", str(work / "report"), "-q"], check=True
        )
        seconds = time.perf_counter() - started
        size = (work / "report" / "report.html").stat().st_size
        print(
            f"layerwise analyze, {len(sentences)} sentences, whole process: {seconds:.1f} s (target < 60 s); report {size / 1024:.0f} KiB"
        )
        # the README's projection figure: three frequent words of the same sentences
        subprocess.run(["layerwise", "plot", str(work / "texts.txt"), "--words", "time,people,good",
                        "-o", str(figure_path("projection.png"))], check=True)  # fmt: skip
        write_result("analyze_speed", {"sentences": len(sentences), "seconds": round(seconds, 1)})
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
