"""Faults against the store: SIGKILL at random moments, and damaged files. Zero silent wrong reads.

    python benchmarks/fault_injection.py [--kills 20] [--sentences 4000] [--flips 24] [--seed 0]

1. An uninterrupted reference store is written in-process (default model, UD EWT sentences,
   small shards so that a run commits often).
2. ``layerwise extract corpus.txt -o killed.lw`` is started as a process and SIGKILLed at a random
   moment after it has committed something new, ``--kills`` times, each run resuming the last;
   then one run finishes it. The result must equal the reference byte for byte (data, offsets,
   manifest).
3. Each kind of damage is applied to a copy of the reference, and the script records what
   ``open_store``, a resume (``extract_to_store`` with the same settings) and ``verify_store`` do.
   A damage is *detected* when each of the three either raises StoreDamagedError or reports it;
   *silent* when any of them returns numbers as if nothing happened.

4. A byte-flip sweep (``--flips`` per file): one byte of every file of a store, and of an activation
   cache, is flipped at evenly spaced offsets, one flip at a time; after each, every read layerwise
   offers is run and compared with the undamaged copy (store: ``store[:]`` with tokens, texts and
   offsets, ``store.array(layer)`` of every layer, ``store.ids``, ``store.manifest``,
   ``lw.read_meta``, ``verify_store``; cache: ``lw.load_cache`` and ``verify_cache``). A flip is
   *harmless* when every read returns the same values and verify says OK, *reported* when a read
   raises StoreDamagedError or verify reports damage, and *silent* when any read returns other
   values without an error. Other exceptions are counted apart (*crashed*). Target: 0 silent.

Prints one line per kill, per damage kind and per file; results go to
benchmarks/results/fault_injection.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from layerwise.errors import StoreDamagedError
from layerwise.store._format import StoreLayout

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import read_documents, write_result  # noqa: E402

LAYOUT = StoreLayout(chunk_rows=64, shard_chunks=4, block_size=300)
CLI_LAYOUT = ["--chunk-rows", "64", "--shard-chunks", "4", "--block-size", "300"]


def committed(path: Path) -> int:
    import layerwise as lw

    try:
        return len(lw.open_store(path))
    except Exception:
        return 0


def same_store(a: Path, b: Path) -> bool:
    import zarr

    import layerwise as lw

    za, zb = zarr.open_group(str(a), mode="r"), zarr.open_group(str(b), mode="r")
    return (
        np.array_equal(za["offsets"][:], zb["offsets"][:])
        and np.array_equal(za["data"][:], zb["data"][:])
        and lw.open_store(a).manifest.to_pylist() == lw.open_store(b).manifest.to_pylist()
    )


def kill_and_resume(source: Path, target: Path, reference: Path, kills: int, rng: random.Random) -> dict:
    command = [sys.executable, "-m", "layerwise.cli", "extract", str(source), "-o", str(target), "-q"]
    command += CLI_LAYOUT
    rows = []
    for k in range(kills):
        process = subprocess.Popen(command)
        before = committed(target)
        deadline = time.time() + 300
        while process.poll() is None and committed(target) <= before and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0, 0.5))
        if process.poll() is not None:
            print(f"kill {k + 1}: the run finished first")
            break
        process.send_signal(signal.SIGKILL)
        process.wait()
        now = committed(target)
        rows.append({"kill": k + 1, "committed_texts": now})
        print(f"kill {k + 1:2d}: SIGKILL with {now} texts committed")
    subprocess.run(command, check=True)
    identical = same_store(target, reference)
    print(
        f"after {len(rows)} kills and a final run: {'identical to' if identical else 'DIFFERENT from'} the reference"
    )
    return {"kills": rows, "identical": identical}


def damage_kinds() -> dict:
    import zarr

    def parts(path):
        return sorted((path / "manifest").glob("part-*.parquet"))

    def shard(path, k):
        return path / "data" / "c" / str(k) / "0" / "0"

    def delete_part(path):
        parts(path)[1].unlink()

    def duplicate_part(path):
        part = parts(path)[1]
        shutil.copy(part, part.with_name(part.stem + "-copy.parquet"))

    def delete_shard(path):
        shard(path, 2).unlink()

    def truncate_shard(path):
        target = shard(path, 1)
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])

    def change_offset(path):
        offsets = zarr.open_group(str(path), mode="r+")["offsets"]
        offsets[10] = offsets[10] + 5

    def shrink_shape(path):
        meta_path = path / "data" / "zarr.json"
        meta = json.loads(meta_path.read_text())
        meta["shape"][0] = meta["shape"][0] // 2
        meta_path.write_text(json.dumps(meta))

    def flip_bytes(path):
        target = shard(path, 3)
        data = bytearray(target.read_bytes())
        data[len(data) // 3] ^= 0xFF
        data[len(data) // 3 + 1] ^= 0xFF
        target.write_bytes(bytes(data))

    return {
        "deleted manifest part": delete_part,
        "duplicated manifest part": duplicate_part,
        "deleted data shard": delete_shard,
        "truncated data shard": truncate_shard,
        "changed offsets entry": change_offset,
        "data/zarr.json shape halved": shrink_shape,
        "flipped bytes in a shard": flip_bytes,
    }


def try_damage(name, damage, reference: Path, work: Path, encoder, texts) -> dict:
    import layerwise as lw

    path = work / name.replace(" ", "_").replace("/", "_")
    shutil.copytree(reference, path)
    damage(path)
    outcome = {}
    exact = lw.open_store(reference)
    try:
        store = lw.open_store(path)
        wrong = [i for i in exact.text_ids() if not np.array_equal(store[i].hidden, exact[i].hidden)]
        outcome["open"] = (
            f"opened; {len(wrong)} texts read wrong" if wrong else "opened; all texts read right"
        )
        outcome["open_silent"] = bool(wrong)
    except lw.StoreDamagedError as exc:
        outcome["open"], outcome["open_silent"] = "StoreDamagedError: " + exc.problems[0], False
    except Exception as exc:  # an honest failure, but not the documented one
        outcome["open"], outcome["open_silent"] = f"{type(exc).__name__}: {str(exc)[:80]}", False
    try:
        summary = lw.extract_to_store(encoder, texts, path, layout=LAYOUT, progress=False)
        outcome["resume"] = f"resumed: {summary.n_written} written"
    except lw.StoreDamagedError as exc:
        outcome["resume"] = "StoreDamagedError: " + exc.problems[0]
    report = lw.verify_store(path)
    outcome["verify"] = (
        "OK" if report.ok else f"damaged: {report.problems[0]}; {len(report.text_ids)} texts named"
    )
    outcome["verify_detects"] = not report.ok
    outcome["silent"] = outcome["open_silent"] or report.ok
    return outcome


SWEEP_LAYOUT = StoreLayout(chunk_rows=64, shard_chunks=4, block_size=40)  # a dozen shards and parts


def _flip(file: Path, at: int) -> bytes:
    original = file.read_bytes()
    data = bytearray(original)
    data[at] ^= 0x5A
    file.write_bytes(bytes(data))
    return original


def _offsets(size: int, flips: int) -> list[int]:
    return sorted({min(size - 1, (k * size) // flips) for k in range(flips)} | {size - 1})


def _store_reads(path: Path) -> dict:
    """Every read of a store layerwise offers, as plain values (or the exception it raised)."""
    import layerwise as lw

    out: dict = {}

    def attempt(name, read):
        try:
            out[name] = read()
        except lw.StoreDamagedError:
            out[name] = "damaged"
        except Exception as exc:  # not the documented error: counted as crashed
            out[name] = f"crashed: {type(exc).__name__}: {str(exc)[:100]}"

    attempt("meta", lambda: lw.read_meta(path))
    try:
        store = lw.open_store(path)
    except lw.StoreDamagedError:
        out["open"] = "damaged"
        return out
    except Exception as exc:
        out["open"] = f"crashed: {type(exc).__name__}: {str(exc)[:100]}"
        return out
    attempt("texts", lambda: [
        (r.hidden.tobytes(), r.tokens, r.text, r.offsets.tobytes(), r.word_ids.tobytes()) for r in store[:]
    ])  # fmt: skip
    for layer in store.layers:
        attempt(f"array({layer})", lambda layer=layer: np.asarray(store.array(layer)).tobytes())
    attempt("ids", lambda: list(store.ids))
    attempt("manifest", lambda: store.manifest.to_pylist())
    return out


def _verdict(reads: dict, reference: dict, verified_ok: bool) -> str:
    values = list(reads.values())
    if any(isinstance(v, str) and v.startswith("crashed") for v in values):
        return "crashed"
    wrong = [k for k, v in reads.items() if v != "damaged" and v != reference.get(k)]
    if wrong:
        return "silent"
    if verified_ok and all(v != "damaged" for v in values):
        return "harmless"
    return "reported"


def _sweep(kind: str, root: Path, files: list[Path], flips: int, reads, verify) -> dict:
    """Flip one byte of each file at ``flips`` evenly spaced offsets, one flip at a time (restored
    after each), and judge every read against the undamaged ones (module docstring, 4)."""
    expected = reads(root)
    per_file: dict = {}
    for file in files:
        counts = {"harmless": 0, "reported": 0, "silent": 0, "crashed": 0}
        examples: list = []
        for at in _offsets(file.stat().st_size, flips):
            original = _flip(file, at)
            try:
                got = reads(root)
                try:
                    verified_ok = verify(root).ok
                except Exception as exc:  # StoreDamagedError from a verify is a report too
                    verified_ok = False
                    if not isinstance(exc, StoreDamagedError):
                        got["verify"] = f"crashed: {type(exc).__name__}: {str(exc)[:100]}"
                verdict = _verdict(got, expected, verified_ok)
                counts[verdict] += 1
                if verdict in ("silent", "crashed") and len(examples) < 3:
                    bad = {k: (v if isinstance(v, str) else "other values") for k, v in got.items()
                           if v != expected.get(k)}  # fmt: skip
                    examples.append({"byte": at, "reads": bad})
            finally:
                file.write_bytes(original)
        name = str(file.relative_to(root))
        per_file[name] = {**counts, "examples": examples}
        print(f"{kind} {name:48s} {counts}")
    return per_file


def sweep_store(work: Path, encoder, texts: list[str], flips: int) -> dict:
    import layerwise as lw

    reference = work / "sweep.lw"
    lw.extract_to_store(
        encoder, texts, reference, lw.OutputPlan(dtype="float16"), progress=False, layout=SWEEP_LAYOUT
    )
    files = sorted(p for p in reference.rglob("*") if p.is_file() and p.name != ".lock")
    return _sweep("store", reference, files, flips, _store_reads, lw.verify_store)


def _cache_reads(path: Path) -> dict:
    import layerwise as lw

    out: dict = {}
    try:
        rows = lw.load_cache(path).with_format("numpy")[:]  # every column, every row
        out["load_cache"] = {name: np.asarray(values).tobytes() for name, values in rows.items()}
    except lw.StoreDamagedError:
        out["load_cache"] = "damaged"
    except Exception as exc:
        out["load_cache"] = f"crashed: {type(exc).__name__}: {str(exc)[:100]}"
    try:
        out["read_meta"] = lw.read_meta(path)
    except lw.StoreDamagedError:
        out["read_meta"] = "damaged"
    except Exception as exc:
        out["read_meta"] = f"crashed: {type(exc).__name__}: {str(exc)[:100]}"
    return out


def sweep_cache(work: Path, encoder, texts: list[str], flips: int) -> dict:
    import layerwise as lw

    reference = work / "sweep-cache"
    lw.cache_activations(
        encoder,
        texts,
        reference,
        lw.CacheOptions(layers="1,-1", context=32, tokens=32 * 40, shard_bytes=100_000),
    )
    files = sorted(p for p in reference.iterdir() if p.is_file() and p.name != ".lock")
    return _sweep("cache", reference, files, flips, _cache_reads, lw.verify_cache)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--sentences", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--flips", type=int, default=24, help="byte flips per file in the sweep (0: none)")
    args = parser.parse_args()

    import layerwise as lw

    rng = random.Random(args.seed)
    sentences = [s for doc in read_documents("train") for s in doc]
    texts = rng.sample(sentences, args.sentences)
    work = Path(tempfile.mkdtemp(prefix="lw-faults-"))
    try:
        source = work / "corpus.txt"
        source.write_text("\n".join(texts) + "\n", encoding="utf-8")
        encoder = lw.Encoder(device="cpu")
        reference = work / "reference.lw"
        lw.extract_to_store(encoder, texts, reference, source=str(source), progress=False, layout=LAYOUT)
        killed = kill_and_resume(source, work / "killed.lw", reference, args.kills, rng)
        damage = {}
        for name, damage_fn in damage_kinds().items():
            outcome = try_damage(name, damage_fn, reference, work, encoder, texts)
            damage[name] = outcome
            print(
                f"{name:28s} | open: {outcome['open'][:70]:70s} | resume: {outcome['resume'][:40]:40s} | verify: {outcome['verify'][:60]}"
            )
        silent = [name for name, o in damage.items() if o["silent"]]
        print(f"silent wrong reads: {len(silent)} {silent if silent else ''}")
        sweep: dict = {}
        if args.flips:
            sweep["store"] = sweep_store(work, encoder, texts[:120], args.flips)
            sweep["cache"] = sweep_cache(work, encoder, texts[:400], args.flips)
            totals = {}
            for kind, files in sweep.items():
                totals[kind] = {
                    k: sum(f[k] for f in files.values())
                    for k in ("harmless", "reported", "silent", "crashed")
                }
                print(f"byte flips in every file of a {kind}: {totals[kind]} over {len(files)} files")
            sweep["totals"] = totals
        write_result(
            "fault_injection",
            {"texts": len(texts), "sigkill": killed, "damage": damage, "silent": silent, "flips_per_file": args.flips,
             "sweep": sweep},
        )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
