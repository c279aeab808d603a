"""Re-measure every CPU figure: each CPU benchmark in turn, on the current commit, then the figures
rendered into the README and the docs (scripts/render_figures.py).

    python benchmarks/run_all.py            # the full runs: every result file in benchmarks/results
    python benchmarks/run_all.py --quick    # small runs of every script, into a temporary folder
    python benchmarks/run_all.py --only packed_speed,roof   # some of them
    python benchmarks/run_all.py --list     # what runs, with its arguments in each mode

**Full mode** runs each script with the arguments its published figures were measured with, writes
over the committed result files, renders, and records how long each script took, and at which
commit, in ``results/run_all.json`` (a run of some scripts with ``--only`` updates theirs; the sum
is the full mode's time once every script has a full run). It refuses a tree with uncommitted
changes: a figure must name the code it measured. On 2 cores it takes hours; the GPU figures come from
``benchmarks/gpu_speed.py`` and its siblings on a machine with a GPU, and the label-free layer
benchmark from the real models of ``requirements-layers.txt`` (``--real-models``).

**Quick mode** runs every script on a small input, writing into a temporary folder
(``LAYERWISE_RESULTS_DIR``), never over the committed results: a check that every benchmark still
runs end to end. Its figures are not published, so it runs as many scripts at once as there are
cores (``--jobs``): one script's process starts, model loads and server waits overlap another's
work. A quick run of every script that passes keeps its time in ``run_all.json`` too.

A script that fails is named with the end of its output, and the run goes on; the exit status is 1
if one failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# script -> (the full run's arguments, as its published figures were measured; the quick run's)
RUNS: dict[str, tuple[list[str], list[str]]] = {
    "packed_speed": ([], ["--sentences", "40", "--documents", "1", "--repeats", "1", "--skip-base"]),
    "roof": ([], ["--texts", "16", "--repeats", "1", "--models", "all-MiniLM-L6-v2", "--dtypes", "float32"]),
    # --profile: the stage split the rendered table reads
    "host_cost": (["--profile"], ["--sentences", "200", "--documents", "2", "--repeats", "1"]),
    "cpu_bf16": ([], ["--texts", "10", "--repeats", "1", "--models", "all-MiniLM-L6-v2"]),
    "extract_speed": ([], ["--sentences", "60", "--documents", "2", "--repeats", "1"]),
    "embed_vs_extract": ([], ["--texts", "100", "--rounds", "1"]),
    "family_speed": ([], ["--sentences", "20", "--repeats", "1", "--families", "gpt_neox,opt"]),
    "reference_speed": ([], ["--sentences", "60", "--documents", "2", "--repeats", "1"]),
    "token_budget": (
        ["--base", "--budgets", "1024,2048,4096,8192"],
        ["--sentences", "60", "--documents", "2", "--repeats", "1", "--budgets", "1024,4096"],
    ),
    "gemm_speed": ([], ["--texts", "64", "--repeats", "1", "--run-texts", "90"]),
    "start_cost": ([], ["--rounds", "1"]),
    "load_and_cast": ([], ["--rounds", "1"]),
    "streamed_speed": ([], ["--sentences", "60", "--documents", "1", "--repeats", "1"]),
    "decoder_speed": ([], ["--sentences", "20", "--documents", "1", "--repeats", "1", "--skip-1b"]),
    "decoder_layers": ([], ["--pairs", "30"]),
    "writer_speed": ([], ["--mb", "32", "--repeats", "1"]),
    "writer_speed_zlib": ([], ["--mb", "32", "--repeats", "1"]),
    "store_speed": ([], "--sentences 100 --documents 2 --repeats 1 --no-rss --cost-rounds 1".split()),
    "store_cost": ([], ["--rounds", "1", "--sentences", "100", "--documents", "2"]),
    "store_open": ([], ["--small", "2000", "--large", "6000"]),  # a 1,000-text slice of each
    "cache_speed": (
        [],
        ["--tokens-minilm", "4096", "--tokens-smollm2", "1024", "--repeats", "1", "--bandwidth-mib", "64"],
    ),
    "cache_memory": ([], ["--small", "20000", "--large", "60000"]),
    "integrity_cost": ([], ["--sentences", "200", "--rounds", "1"]),
    "fault_injection": ([], ["--kills", "1", "--sentences", "100", "--flips", "2"]),
    "fuzz_alignment": (
        [],
        ["--examples", "30", "--family-examples", "30", "--tokenizers", "wordpiece,neox,t5"],
    ),
    "corpus_io": ([], ["--part", "speed", "--speed-texts", "300", "--speed-rounds", "1"]),
    "serve_load": (
        ["--ratio-rounds", "7"],
        "--clients 1,8 --seconds 2 --texts 100 --soak 2 --soak-parts 1 --ratio-rounds 1".split(),
    ),
    "serve_bounds": ([], ["--clients", "4", "--seconds", "2", "--endpoints", "layers_npz,explore_attention"]),
    "fuzz_http": (["--examples", "1000"], ["--examples", "10"]),
    "ray_scaling": ([], ["--sentences", "200", "--documents", "2"]),
    "analyze_speed": ([], ["--sentences", "40"]),
    "probe_ud_ewt": ([], ["--max-train", "50"]),
    "pretrain_ud_ewt": ([], ["--steps", "20"]),
    "family_sweep": ([], ["--types", "bert,llama,t5,mamba,albert"]),
    "media_speed": ([], ["--images", "8", "--clips", "4", "--batch-size", "4", "--repeats", "1"]),
    "hostile_families": ([], ["--families", "llama,t5,modernbert"]),
    "label_free_layers": (["--rescore"], ["--rescore"]),
}
# a result file written under another name than its script's
SCRIPT_OF = {"writer_speed_zlib": "writer_speed"}
EXTRA_FULL = {"writer_speed_zlib": ["--crc", "zlib", "--output", "benchmarks/results/writer_speed_zlib.json"]}
EXTRA_QUICK = {"writer_speed_zlib": ["--crc", "zlib"]}


def command(name: str, quick: bool, out: Path | None) -> list[str]:
    full, small = RUNS[name]
    extra = (EXTRA_QUICK if quick else EXTRA_FULL).get(name, [])
    if quick and name == "writer_speed_zlib" and out is not None:
        extra = [*extra, "--output", str(out / "writer_speed_zlib.json")]
    script = HERE / f"{SCRIPT_OF.get(name, name)}.py"
    return [sys.executable, str(script), *(small if quick else full), *extra]


def record(mode: str, done: dict[str, dict], total: float | None = None, jobs: int = 1) -> None:
    """Keep how long a run took in ``results/run_all.json`` (the README's times come from it): in
    full mode each script's last full run, one at a time, and their sum once every script has one;
    in quick mode the last quick run of every script, as a whole."""
    sys.path.insert(0, str(HERE))
    from common import machine

    path = HERE / "results" / "run_all.json"
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    now = machine()
    # each record keeps its own machine: scripts timed on different days may run on different boxes
    stamp = {"commit": now["commit"], "date": now["date"], "cpu": now["cpu"], "cores": now["cores"]}
    if mode == "full":
        scripts = {**data.get("full", {}).get("scripts", {}), **{k: {**stamp, **v} for k, v in done.items()}}
        whole = all(scripts.get(name, {}).get("exit") == 0 for name in RUNS)
        seconds = round(sum(scripts[name]["seconds"] for name in RUNS)) if whole else None
        data["full"] = {"seconds": seconds, "scripts": dict(sorted(scripts.items()))}
    else:
        data["quick"] = {"seconds": round(total or 0), "jobs": jobs, **stamp, "scripts": done}
    data["machine"] = now
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def dirty() -> bool:
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
    )
    return bool(status.stdout.strip())


# the quick runs that took longest (run_all.json's quick record: fixed costs of processes, model
# loads, servers), started first so that the short ones fill the other job's gaps
QUICK_LONG_FIRST = (
    "decoder_speed", "packed_speed", "store_speed", "decoder_layers", "family_speed", "load_and_cast",
    "gemm_speed", "probe_ud_ewt", "serve_bounds", "streamed_speed",
)  # fmt: skip


def run_one(name: str, quick: bool, out: Path | None, env: dict[str, str], label: str) -> dict:
    args = command(name, quick, out)
    print(f"{label} {name}: {' '.join(args[1:])}", flush=True)
    started = time.perf_counter()
    result = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = round(time.perf_counter() - started, 1)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip()[-1500:]
        print(f"  {name} FAILED ({seconds} s, exit {result.returncode}):\n{tail}", flush=True)
    else:
        print(f"  {name}: {seconds} s", flush=True)
    return {"seconds": seconds, "exit": result.returncode}


def run(
    names: list[str],
    quick: bool,
    out: Path | None,
    jobs: int = 1,
    after: Callable[[str, dict], None] | None = None,
) -> dict[str, dict]:
    """Each of ``names`` in a process of its own, ``jobs`` at a time (more than one only for quick
    runs, whose figures are not published: two scripts at once on 2 cores overlap one's process starts,
    model loads and server waits with the other's work)."""
    env = {**os.environ, **({"LAYERWISE_RESULTS_DIR": str(out)} if out is not None else {})}
    # scripts call the `layerwise` command: this Python's environment's, activated or not
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if jobs > 1:  # two scripts' OpenMP threads share the cores: a waiting thread sleeps, not spins
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        names = sorted(
            names, key=lambda n: QUICK_LONG_FIRST.index(n) if n in QUICK_LONG_FIRST else len(names)
        )
    labels = {name: f"[{i}/{len(names)}]" for i, name in enumerate(names, 1)}
    done: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_one, name, quick, out, env, labels[name]): name for name in names}
        for future in as_completed(futures):
            done[futures[future]] = future.result()
            if after is not None:  # kept as each ends: a run stopped midway keeps what it measured
                after(futures[future], done[futures[future]])
    return {name: done[name] for name in names}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small runs into a temporary folder")
    parser.add_argument("--only", default="", help="comma-separated names (default: every one)")
    parser.add_argument("--list", action="store_true", help="print what would run, and stop")
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="scripts at once in quick mode (default: the cores); full mode runs one",
    )
    given = parser.parse_args()
    names = [n for n in given.only.split(",") if n] or list(RUNS)
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        parser.error(f"no benchmark {', '.join(unknown)}; choose among {', '.join(RUNS)}")
    if given.list:
        for name in names:
            full = " ".join(command(name, False, None)[2:]) or "(defaults)"
            print(f"{name}: full {full}; quick {' '.join(command(name, True, None)[2:])}")
        return 0
    if not given.quick and given.jobs > 1:
        parser.error("--jobs is for --quick: published figures are measured one script at a time")
    if not given.quick and dirty():
        why = "the tree has uncommitted changes: commit them first, so that each figure names the code it measured"
        print(f"{why} (or pass --quick, which publishes nothing)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    if given.quick:
        jobs = given.jobs or len(os.sched_getaffinity(0))
        with tempfile.TemporaryDirectory(prefix="layerwise-quick-") as tmp:
            done = run(names, True, Path(tmp), jobs)
        if names == list(RUNS) and all(d["exit"] == 0 for d in done.values()):
            record("quick", done, time.perf_counter() - started, jobs)
    else:
        done = run(names, False, None, after=lambda name, d: record("full", {name: d}))
        subprocess.run([sys.executable, str(REPO / "scripts" / "render_figures.py")], cwd=REPO, check=False)
    failed = [name for name, d in done.items() if d["exit"] != 0]
    total = round(time.perf_counter() - started)
    summary = f"{len(done) - len(failed)} of {len(done)} ran in {total // 60} min {total % 60} s"
    print(summary + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
