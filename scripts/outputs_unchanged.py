"""Are the saved outputs of every family byte-identical at two commits? Each family of the hostile
pass (benchmarks/hostile_families.py) is built tiny and random once; each commit's code (a git
worktree, on PYTHONPATH) writes the same .npz outputs of it (every token at every layer, and
mean-pooled sentences) in a fresh process; every array but the metadata is compared byte for byte.
A family the earlier commit refused or broke on is counted as new, not compared. Between 01a6cff
(before the families' audit, #81) and its end: 37 of 46 families byte-identical; ConvBERT and
Nyströmformer differ (before, a padded batch leaked into their states: up to 1.1e-2 off
transformers' states of each text alone, which the hostile pass now holds them to); 7 new.

    python scripts/outputs_unchanged.py [--before 01a6cff] [--after HEAD] [--families llama,t5] [--deep]

``--deep`` writes every way a family runs, each as raw arrays: in memory with each final norm, the
sub-layer taps, long texts in windows, two concurrent forwards, streamed (with windows), and the
general path (by hooks, cut early, attention probabilities); a way both commits refuse alike is
left out, one refused by only one commit is listed.

Prints the families identical, different (named, with the arrays that differ) and new; exits 1 if
one differs. The metadata is left out: it records the code's version and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

# run by each commit's code: one folder of outputs per family, or the error that stopped it
WRITE = """
import json, sys, traceback
from pathlib import Path
import layerwise as lw
texts = ["The bank raised rates.", "A much longer sentence about the river bank, and the fish.", "Hi"]
out, said = Path(sys.argv[1]), {}
for folder in sys.argv[2:]:
    name = Path(folder).name
    try:
        encoder = lw.Encoder(folder, device="cpu")
        lw.extract_to_file(encoder, texts, out / f"{name}-tokens.npz", progress=False)
        plan = lw.OutputPlan(level="sentence", mode="mean")
        lw.extract_to_file(encoder, texts, out / f"{name}-mean.npz", plan, progress=False)
        said[name] = "written"
    except Exception as exc:
        said[name] = f"{type(exc).__name__}: {exc}"[:200]
(out / "said.json").write_text(json.dumps(said))
"""

# --deep: every way a packed family runs, each kept as raw arrays (hidden states, taps): in memory
# with the final norm none, last and all, the sub-layer taps, long texts in windows, two concurrent
# forwards, and streamed; a way the commit refuses for a family is recorded as refused, not compared
WRITE_DEEP = """
import json, sys
from pathlib import Path
import numpy as np
import layerwise as lw
long = " ".join(["The river bank was quiet, and the fish swam near the reeds all morning."] * 6)
texts = ["The bank raised rates.", "A much longer sentence about the river bank, and the fish.", "Hi", long]
WAYS = {
    "raw": ({}, {"final_norm": False}),
    "last": ({}, {"final_norm": True}),
    "all": ({}, {"final_norm": "all"}),
    "taps": ({}, {"taps": ("attn_out", "mlp_out")}),
    "windows": ({"max_length": 24}, {"long_texts": "window", "stride": 8}),
    "streams": ({"streams": 2, "max_tokens": 64}, {}),  # concurrent_forwards, as earlier commits name it
    "streamed": ({"streaming": True}, {}),
    "streamed-windows": ({"streaming": True, "max_length": 24}, {"long_texts": "window", "stride": 8}),
    # the general path (transformers' own forward): read by hooks, cut early, eager attention's probabilities
    "general": ({"packed": False}, {}),
    "general-hooks": ({"packed": False}, {"method": "hooks"}),
    "general-cut": ({"packed": False}, {"layers": [0, 1]}),
    "general-probs": ({"packed": False}, {"taps": ("attention_probs",), "layers": [1, 2]}),
}
out, said = Path(sys.argv[1]), {}
for folder in sys.argv[2:]:
    name = Path(folder).name
    for way, (options, call) in WAYS.items():
        try:
            encoder = lw.Encoder(folder, device="cpu", **options)
            stacks = encoder.extract(texts, progress=False, **{"layers": "all", **call})
            arrays = {f"hidden{i}": s.hidden for i, s in enumerate(stacks)}
            for i, s in enumerate(stacks):
                for tap, value in (s.taps or {}).items():
                    arrays[f"{tap}{i}"] = value
            np.savez(out / f"{name}-{way}.npz", **arrays)
            said[f"{name}-{way}"] = "written"
        except Exception as exc:
            said[f"{name}-{way}"] = f"{type(exc).__name__}: {exc}"[:200]
(out / "said.json").write_text(json.dumps(said))
"""
DEEP_WAYS = (
    "raw",
    "last",
    "all",
    "taps",
    "windows",
    "streams",
    "streamed",
    "streamed-windows",
    "general",
    "general-hooks",
    "general-cut",
    "general-probs",
)


def write_outputs(commit: str, folders: list[Path], out: Path, trees: Path, script: str) -> dict[str, str]:
    tree = trees / commit
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), commit], cwd=REPO, check=True)
    try:
        env = {**os.environ, "PYTHONPATH": str(tree / "src"), "HF_HUB_OFFLINE": "1"}
        out.mkdir(parents=True)
        command = [sys.executable, "-c", script, str(out), *map(str, folders)]
        subprocess.run(command, env=env, check=True, capture_output=True)
        return json.loads((out / "said.json").read_text())
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=True)


def differing_arrays(a: Path, b: Path) -> list[str]:
    """The arrays of two .npz files that are not byte-identical, each with its largest difference."""
    import numpy as np

    out = []
    with np.load(a) as first, np.load(b) as second:
        for name in sorted((set(first.files) | set(second.files)) - {"meta"}):
            if name not in first.files or name not in second.files:
                out.append(f"{name} (in one only)")
            elif first[name].dtype != second[name].dtype or first[name].shape != second[name].shape:
                x, y = first[name], second[name]
                out.append(f"{name} ({x.dtype}{x.shape} != {y.dtype}{y.shape})")
            elif first[name].tobytes() != second[name].tobytes():
                gap = np.abs(first[name].astype(np.float64) - second[name].astype(np.float64)).max()
                out.append(f"{name} (largest difference {gap:.1e})")
    return out


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args.add_argument("--before", default="01a6cff")
    args.add_argument("--after", default="HEAD")
    args.add_argument("--families", default="")
    args.add_argument("--deep", action="store_true", help="every way a family runs (streamed, taps, …)")
    given = args.parse_args()
    script, kinds = (WRITE_DEEP, DEEP_WAYS) if given.deep else (WRITE, ("tokens", "mean"))
    from hostile_families import families

    chosen = {f for f in given.families.split(",") if f} or None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folders = []
        for name, make in families(chosen).items():
            try:
                folders.append(make(work / "models" / name))
            except Exception as exc:  # transformers cannot build it here: neither commit reads it
                print(f"{name}: not built ({type(exc).__name__})")
        before = write_outputs(given.before, folders, work / "before", work / "trees", script)
        after = write_outputs(given.after, folders, work / "after", work / "trees", script)
        same, differ, new, alike, compared = [], [], [], [], 0
        for folder in folders:
            name, arrays = folder.name, []
            for kind in kinds:
                key = name if not given.deep else f"{name}-{kind}"
                if before.get(key) != "written" or after.get(key) != "written":
                    if before.get(key) != after.get(key) or not given.deep:
                        new.append(f"{key} (before: {before.get(key)}; after: {after.get(key)})")
                    else:
                        alike.append(f"{key}: {before.get(key)}")
                    continue
                compared += 1
                files = [work / side / f"{name}-{kind}.npz" for side in ("before", "after")]
                arrays += [f"{kind}:{array}" for array in differing_arrays(*files)]
            (differ if arrays else same).append(f"{name} ({', '.join(arrays)})" if arrays else name)
    print(f"outputs compared: {compared}; refused alike by both commits: {len(alike)}")
    for line in alike:
        print("  " + line)
    print(f"identical: {len(same)}: {', '.join(same)}")
    print(f"different: {len(differ)}: {'; '.join(differ) or '-'}")
    print(f"not compared (one commit refused or broke): {len(new)}")
    for line in new:
        print("  " + line)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
