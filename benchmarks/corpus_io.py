"""Corpus in, vectors out: does memory follow the batch or the corpus, and does the format cost time?

    python benchmarks/corpus_io.py                   # all five parts (about 36 minutes on 2 cores)
    python benchmarks/corpus_io.py --part read       # or: full, ray, speed, trim

  read   peak RSS of `layerwise extract BIG --limit 50000 --layers 0 --pool sentence:mean -o x.parquet`
         on generated corpora of 100k and 10M lines (.parquet, .txt.gz): the same 50,000 texts are
         extracted from each; a reader that held the file would grow with it. `--layers 0` runs no
         encoder layer, so this measures the data path.
  full   RSS, sampled every second, of the whole path on 200k UD EWT sentences (repeated) from
         .parquet to sentence-level Parquet with the default model: flat after the first minute?
  ray    the driver's peak RSS (VmHWM) for `--ray local --layers 0` on 100k and 2M texts (.txt), and
         the seconds it plans before any actor starts: the driver plans shards from one streamed
         pass and the actors read their own rows.
  speed  `extract_to_file` on the same 2,000 texts from .txt and from .parquet, alternating, 5 rounds
         each: the median seconds and their ratio.
  trim   what giving free heap pages back costs (src/layerwise/_host/memory.py): 30,000 texts to sentence-level
         Parquet in one process, without a trim and with one every 3, 10 and 30 s, alternating, 2
         rounds: seconds, the median RSS of each run's second half and at each whole minute.

Corpora are UD English EWT train sentences (CC BY-SA 4.0, benchmarks/data/ud_ewt) repeated in
order. Results: benchmarks/results/corpus_io.json (with the machine). Ray runs in a network
namespace with only loopback (`unshare -n`, as root).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import machine, read_documents, read_result, result_path  # noqa: E402

RESULTS = result_path("corpus_io")  # LAYERWISE_RESULTS_DIR sends a run elsewhere (run_all --quick)
CLI = [sys.executable, "-m", "layerwise.cli", "extract"]


def sentences() -> list[str]:
    return [s for doc in read_documents("train") for s in doc if s.strip()]


def write_corpus(folder: Path, n: int, kinds: tuple[str, ...] = ("parquet", "txt.gz")) -> dict[str, Path]:
    """``n`` lines of UD EWT sentences repeated in order, as each of ``kinds``, written streaming."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = sentences()
    paths = {kind: folder / f"corpus_{n}.{kind}" for kind in kinds}
    if all(p.exists() for p in paths.values()):
        return paths
    writers = {}
    if "parquet" in paths:
        schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
        writers["parquet"] = pq.ParquetWriter(paths["parquet"], schema, compression="zstd")
    if "txt.gz" in paths:
        writers["txt.gz"] = gzip.open(paths["txt.gz"], "wt", encoding="utf-8", compresslevel=1)  # noqa: SIM115
    if "txt" in paths:
        writers["txt"] = open(paths["txt"], "w", encoding="utf-8")  # noqa: SIM115
    step = 100_000
    for start in range(0, n, step):
        rows = [base[i % len(base)] for i in range(start, min(start + step, n))]
        if "parquet" in writers:
            ids = pa.array(range(start, start + len(rows)), type=pa.int64())
            writers["parquet"].write_table(pa.table({"id": ids, "text": rows}, schema=schema))
        for kind in ("txt.gz", "txt"):
            if kind in writers:
                writers[kind].write("\n".join(rows) + "\n")
    for writer in writers.values():
        writer.close()
    return paths


def peak_rss_mib(command: list[str], *, sample: float | None = None) -> tuple[float, float, list]:
    """(peak RSS of the command's process in MiB, seconds, [(t, RSS MiB)] when sampling)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    samples, hwm = [], 0.0
    while process.poll() is None:
        status = _status(process.pid)
        if status:
            hwm = max(hwm, status.get("VmHWM", 0.0))
            if sample is not None:
                samples.append((round(time.perf_counter() - started, 1), status.get("VmRSS", 0.0)))
        time.sleep(sample or 0.2)
    seconds = time.perf_counter() - started
    stderr = process.stderr.read().decode() if process.stderr else ""
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{stderr}")
    LAST_STDERR[:] = [stderr]
    return hwm, seconds, samples


LAST_STDERR: list[str] = [""]  # what the last peak_rss_mib command printed (its summary)


def _status(pid: int) -> dict[str, float]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0]) / 1024
    return out


def part_read(scratch: Path) -> dict:
    out: dict = {}
    for n in (100_000, 10_000_000):
        paths = write_corpus(scratch, n)
        for kind, path in paths.items():
            target = scratch / "read.parquet"
            command = [*CLI, str(path), "--limit", "50000", "--layers", "0", "--pool", "sentence:mean",
                       "-o", str(target), "-q"]  # fmt: skip
            peak, seconds, _ = peak_rss_mib(command)
            out[f"{kind} {n:,} lines"] = {"peak_rss_mib": round(peak, 1), "seconds": round(seconds, 1),
                                          "file_mib": round(path.stat().st_size / 2**20, 1)}  # fmt: skip
            print(f"read  {kind:8s} {n:>11,} lines: peak RSS {peak:7.1f} MiB, {seconds:5.1f} s", flush=True)
    for kind in ("parquet", "txt.gz"):
        small, big = out[f"{kind} 100,000 lines"], out[f"{kind} 10,000,000 lines"]
        out[f"{kind} growth"] = round(big["peak_rss_mib"] / small["peak_rss_mib"] - 1, 4)
    return out


def part_full(scratch: Path, n: int = 200_000) -> dict:
    path = write_corpus(scratch, n, ("parquet",))["parquet"]
    command = [*CLI, str(path), "--pool", "sentence:mean", "-o", str(scratch / "full.parquet"), "-q"]
    peak, seconds, samples = peak_rss_mib(command, sample=1.0)
    after = [rss for t, rss in samples if t >= 60]
    third = max(1, len(after) // 3)
    early, late = after[:third], after[-third:]
    report = {
        "n_texts": n,
        "seconds": round(seconds, 1),
        "texts_per_s": round(n / seconds),
        "peak_rss_mib": round(peak, 1),
        "rss_at_60_s_mib": round(after[0], 1) if after else None,
        # RSS oscillates as batches come and go: compare the first and last thirds after a minute
        "median_rss_first_third_mib": round(statistics.median(early), 1) if after else None,
        "median_rss_last_third_mib": round(statistics.median(late), 1) if after else None,
        "max_rss_first_third_mib": round(max(early), 1) if after else None,
        "max_rss_last_third_mib": round(max(late), 1) if after else None,
        "growth_median": round(statistics.median(late) / statistics.median(early) - 1, 4) if after else None,
        "samples": samples[::10],
    }
    print(
        f"full  {n:,} texts in {seconds:.0f} s: median RSS after 60 s, first third "
        f"{report['median_rss_first_third_mib']} MiB, last third {report['median_rss_last_third_mib']} MiB"
    )
    return report


def part_ray(scratch: Path) -> dict:
    if os.environ.get("LAYERWISE_IN_NETNS") != "1":
        command = " ".join(
            [sys.executable, str(Path(__file__).resolve()), "--part", "ray", "--scratch", str(scratch)]
        )
        script = f"ip link set lo up && LAYERWISE_IN_NETNS=1 {command}"
        subprocess.run(["unshare", "-n", "sh", "-c", script], check=True)
        return json.loads(RESULTS.read_text())["ray"]
    out: dict = {}
    for n in (100_000, 2_000_000):
        path = write_corpus(scratch, n, ("txt",))["txt"]
        target = scratch / f"ray_{n}.lw"
        command = [*CLI, str(path), "--ray", "local", "--workers", "2", "--layers", "0", "--pool",
                   "sentence:mean", "-o", str(target), "--overwrite"]  # fmt: skip
        peak, seconds, _ = peak_rss_mib(command)
        # the driver's one pass over the corpus and its table, before any actor starts (its summary)
        planned = float(re.search(r"planned in ([\d.]+) s", LAST_STDERR[0]).group(1))  # type: ignore[union-attr]
        out[f"{n:,} texts"] = {"driver_peak_rss_mib": round(peak, 1), "seconds": round(seconds, 1),
                               "plan_seconds": planned}  # fmt: skip
        print(f"ray   {n:>11,} texts: driver peak RSS {peak:7.1f} MiB, planned in {planned:.1f} s, {seconds:5.1f} s",
              flush=True)  # fmt: skip
    small, big = out["100,000 texts"], out["2,000,000 texts"]
    out["growth"] = round(big["driver_peak_rss_mib"] / small["driver_peak_rss_mib"] - 1, 4)
    return out


def part_speed(scratch: Path, n: int = 2000, rounds: int = 5) -> dict:
    import layerwise as lw

    paths = write_corpus(scratch, n, ("parquet", "txt"))
    encoder = lw.Encoder(device="cpu")
    plan = lw.OutputPlan.parse(pool="sentence:mean")
    lw.extract_to_file(encoder, paths["txt"], scratch / "warm.npz", plan, progress=False)
    times: dict[str, list[float]] = {"txt": [], "parquet": []}
    for _ in range(rounds):
        for kind in ("txt", "parquet"):
            started = time.perf_counter()
            lw.extract_to_file(encoder, paths[kind], scratch / f"{kind}.npz", plan, progress=False)
            times[kind].append(time.perf_counter() - started)
    txt, parquet = statistics.median(times["txt"]), statistics.median(times["parquet"])
    print(f"speed {n} texts: .txt {txt:.2f} s, .parquet {parquet:.2f} s, parquet/txt {parquet / txt:.3f}")
    return {"n_texts": n, "txt_s": round(txt, 3), "parquet_s": round(parquet, 3),
            "parquet_over_txt": round(parquet / txt, 4), "runs": times}  # fmt: skip


def part_trim(
    scratch: Path, n: int = 30_000, rounds: int = 2, intervals: tuple[float, ...] = (3, 10, 30)
) -> dict:
    import threading

    import layerwise as lw
    from layerwise._host import memory

    path = write_corpus(scratch, n, ("parquet",))["parquet"]
    encoder = lw.Encoder(device="cpu")
    plan = lw.OutputPlan.parse(pool="sentence:mean")
    lw.extract_to_file(encoder, lw.Corpus(path, limit=2000), scratch / "warm.parquet", plan, progress=False)
    variants = {"no trim": float("inf"), **{f"every {t:g} s": t for t in intervals}}
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, every in variants.items():
            memory.release_free_memory.__kwdefaults__["every"] = every  # the engine's default interval
            samples: list[float] = []
            done = threading.Event()

            def sample(samples=samples, done=done) -> None:
                while not done.wait(1.0):
                    samples.append(_status(os.getpid()).get("VmRSS", 0.0))

            thread = threading.Thread(target=sample, daemon=True)
            thread.start()
            started = time.perf_counter()
            lw.extract_to_file(encoder, path, scratch / "trim.parquet", plan, progress=False)
            seconds = time.perf_counter() - started
            done.set()
            thread.join()
            half = samples[len(samples) // 2 :]
            minutes = {  # the median RSS within 15 s of each whole minute: does it creep?
                f"{m} min": round(statistics.median(samples[m * 60 - 15 : m * 60 + 15]))
                for m in range(1, len(samples) // 60 + 1)
            }
            runs[name].append(
                {
                    "seconds": round(seconds, 1),
                    "median_rss_mib": round(statistics.median(half)),
                    "minutes": minutes,
                }
            )
            print(
                f"trim  {name:10s}: {seconds:5.1f} s, median RSS (second half) {statistics.median(half):.0f} MiB"
            )
    memory.release_free_memory.__kwdefaults__["every"] = memory.TRIM_EVERY_S
    summary = {
        name: {key: statistics.median(r[key] for r in rs) for key in ("seconds", "median_rss_mib")}
        for name, rs in runs.items()
    }
    base = summary["no trim"]
    versus = {name: {"time_cost": round(s["seconds"] / base["seconds"] - 1, 4),
                     "rss_saved": round(1 - s["median_rss_mib"] / base["median_rss_mib"], 4)}
              for name, s in summary.items() if name != "no trim"}  # fmt: skip
    for name, v in versus.items():
        print(f"trim  {name:10s}: {v['time_cost']:+.1%} time, {v['rss_saved']:.1%} less RSS than no trim")
    return {"n_texts": n, "runs": runs, "median": summary, "versus_no_trim": versus}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("read", "full", "ray", "speed", "trim", "all"), default="all")
    parser.add_argument("--scratch", type=Path, default=None, help="Folder for the generated corpora")
    parser.add_argument("--speed-texts", type=int, default=2000, help="texts of the speed part")
    parser.add_argument("--speed-rounds", type=int, default=5, help="rounds of the speed part")
    args = parser.parse_args()
    scratch = args.scratch or Path(tempfile.gettempdir()) / "layerwise-corpus-io"
    scratch.mkdir(parents=True, exist_ok=True)
    report = read_result("corpus_io")  # the parts not rerun are kept
    parts = ("read", "full", "ray", "speed", "trim") if args.part == "all" else (args.part,)
    for part in parts:
        sizes = {"n": args.speed_texts, "rounds": args.speed_rounds} if part == "speed" else {}
        report[part] = globals()[f"part_{part}"](scratch, **sizes)
        report["machine"] = machine()
        RESULTS.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
