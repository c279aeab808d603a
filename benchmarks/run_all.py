"""Re-measure every CPU figure: each CPU benchmark in turn, on the current commit, then the figures
rendered into the README and the docs (scripts/render_figures.py).

    python benchmarks/run_all.py            # the full runs: every result file in benchmarks/results
    python benchmarks/run_all.py --quick    # small runs of every script, into a temporary folder
    python benchmarks/run_all.py --only packed_speed,roof   # some of them
    python benchmarks/run_all.py --list     # what runs, with its arguments in each mode

**Full mode** runs each script with the arguments its published figures were measured with, writes
over the committed result files, renders, and records how long each script took in
``results/run_all.json``. It refuses a tree with uncommitted changes: a figure must name the code
it measured. On 2 cores it takes hours (``run_all.json`` says how many); the GPU figures come from
``benchmarks/gpu_speed.py`` and its siblings on a machine with a GPU, and the label-free layer
benchmark from the real models of ``requirements-layers.txt`` (``--real-models``).

**Quick mode** runs every script on a small input, writing into a temporary folder
(``LAYERWISE_RESULTS_DIR``), never over the committed results: a check that every benchmark still
runs end to end. Its figures are not published. It aims at 15 minutes on 2 cores; a few scripts'
fixed costs (processes of their own, tokenizers trained, servers started) keep it above that today.

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
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# script -> (the full run's arguments, as its published figures were measured; the quick run's)
RUNS: dict[str, tuple[list[str], list[str]]] = {
    "packed_speed": ([], ["--sentences", "40", "--documents", "1", "--repeats", "1", "--base-texts", "8"]),
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
    "decoder_layers": ([], ["--pairs", "60"]),
    "writer_speed": ([], ["--mb", "32", "--repeats", "1"]),
    "writer_speed_zlib": ([], ["--mb", "32", "--repeats", "1"]),
    "store_speed": ([], ["--sentences", "100", "--documents", "2", "--repeats", "1", "--no-rss"]),
    "store_cost": ([], ["--rounds", "1", "--sentences", "100", "--documents", "2"]),
    "store_open": ([], ["--small", "2000", "--large", "6000"]),  # a 1,000-text slice of each
    "cache_speed": ([], ["--tokens-minilm", "4096", "--tokens-smollm2", "1024", "--repeats", "1"]),
    "cache_memory": ([], ["--small", "20000", "--large", "60000"]),
    "integrity_cost": ([], ["--sentences", "200", "--rounds", "1"]),
    "fault_injection": ([], ["--kills", "1", "--sentences", "100", "--flips", "2"]),
    "fuzz_alignment": ([], ["--examples", "30", "--tokenizers", "wordpiece,neox,t5"]),
    "corpus_io": ([], ["--part", "speed"]),
    "serve_load": (
        ["--ratio-rounds", "7"],
        ["--clients", "1,8", "--seconds", "2", "--texts", "100", "--soak-parts", "1", "--ratio-rounds", "1"],
    ),
    "serve_bounds": ([], ["--clients", "4", "--seconds", "2", "--endpoints", "layers_npz,explore_attention"]),
    "fuzz_http": (["--examples", "1000"], ["--examples", "30"]),
    "ray_scaling": ([], ["--sentences", "200", "--documents", "2"]),
    "analyze_speed": ([], ["--sentences", "40"]),
    "probe_ud_ewt": ([], ["--max-train", "100"]),
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


def dirty() -> bool:
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
    )
    return bool(status.stdout.strip())


def run(names: list[str], quick: bool, out: Path | None) -> dict[str, dict]:
    env = {**os.environ, **({"LAYERWISE_RESULTS_DIR": str(out)} if out is not None else {})}
    # scripts call the `layerwise` command: this Python's environment's, activated or not
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done: dict[str, dict] = {}
    for i, name in enumerate(names, 1):
        args = command(name, quick, out)
        print(f"[{i}/{len(names)}] {name}: {' '.join(args[1:])}", flush=True)
        started = time.perf_counter()
        result = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
        seconds = round(time.perf_counter() - started, 1)
        done[name] = {"seconds": seconds, "exit": result.returncode}
        if result.returncode != 0:
            tail = (result.stdout + result.stderr).strip()[-1500:]
            print(f"  FAILED ({seconds} s, exit {result.returncode}):\n{tail}", flush=True)
        else:
            print(f"  {seconds} s", flush=True)
    return done


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small runs into a temporary folder")
    parser.add_argument("--only", default="", help="comma-separated names (default: every one)")
    parser.add_argument("--list", action="store_true", help="print what would run, and stop")
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
    if not given.quick and dirty():
        why = "the tree has uncommitted changes: commit them first, so that each figure names the code it measured"
        print(f"{why} (or pass --quick, which publishes nothing)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    if given.quick:
        with tempfile.TemporaryDirectory(prefix="layerwise-quick-") as tmp:
            done = run(names, True, Path(tmp))
    else:
        done = run(names, False, None)
        subprocess.run([sys.executable, str(REPO / "scripts" / "render_figures.py")], cwd=REPO, check=False)
        total = round(time.perf_counter() - started)
        if names == list(RUNS):  # how long the full mode takes: a run of some scripts does not say
            record = {"mode": "full", "seconds": total, "scripts": done}
            (HERE / "results" / "run_all.json").write_text(
                json.dumps(record, indent=1) + "\n", encoding="utf-8"
            )
    failed = [name for name, d in done.items() if d["exit"] != 0]
    total = round(time.perf_counter() - started)
    summary = f"{len(done) - len(failed)} of {len(done)} ran in {total // 60} min {total % 60} s"
    print(summary + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
