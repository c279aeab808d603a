"""The GPU's limits and the sentence-vector contenders of ``gpu_speed.py --part embed``, each figure
printed beside its limit, measured in the same run:

- ``pinned_d2h_gb_per_s``: a 1 GiB device tensor copied into pinned host memory;
- ``full_batch_forward``: the model's forward alone on full batches of 64 x 256 tokens (no host copy);
- ``packed_forward``: layerwise's packed forward of the corpus, from token ids, nothing copied to
  the host;
- ``pooled_loop``: the fifteen-line loop that pools on the GPU (texts sorted by token count, padded
  batches of at most 16,384 tokens, the masked mean of every hidden state, then ``(B, L, H)`` to the
  host as float32);
- ``embed``: ``enc.embed(texts, layers="all", pool="mean")``, from strings;
- ``extract_float16``: ``enc.extract(texts, layers="all", dtype="float16")``, every token;
- ``first_call`` and ``second_call``: a fresh Encoder's first ``embed`` and its second, apart from the
  warm medians.

``--part store`` (``measure_store``): ``lw.extract_to_store`` of every layer, float16 on disk, in MB/s
written beside the disk's own (dd with fsync, same folder), and a whole ``layerwise extract`` process
on a one-line corpus.

``--device cpu`` with a few texts is a dry run of the code, not a figure.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from common import interleaved_times

import layerwise as lw
from layerwise._inputs.batches import length_sorted_batches
from layerwise._inputs.block import TokenColumns


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def pinned_bandwidth(device: str, n_bytes: int = 2**30) -> float | None:
    """GB/s of one device -> pinned host copy of ``n_bytes`` (the best of three); None off a GPU."""
    if device != "cuda":
        return None
    source = torch.empty(n_bytes // 2, dtype=torch.float16, device=device)
    target = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
    best = float("inf")
    for _ in range(3):
        _sync(device)
        started = time.perf_counter()
        target.copy_(source, non_blocking=True)
        _sync(device)
        best = min(best, time.perf_counter() - started)
    return n_bytes / best / 1e9


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def pooled_loop(folder: Path, dtype: torch.dtype, texts: list[str], device: str):
    """The hand-written loop that pools on the GPU; returns a callable counting the tokens it read."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, dtype=dtype).to(device).eval()
    ids = tokenizer(texts, truncation=True, max_length=512)["input_ids"]
    order = sorted(range(len(texts)), key=lambda i: len(ids[i]), reverse=True)

    def run() -> int:
        n_tokens, start = 0, 0
        with torch.inference_mode():
            while start < len(order):
                size = max(1, 16384 // len(ids[order[start]]))  # the longest text first: a token budget
                chunk = order[start : start + size]
                batch = tokenizer.pad([{"input_ids": ids[i]} for i in chunk], return_tensors="pt").to(device)
                states = torch.stack(model(**batch, output_hidden_states=True).hidden_states)  # (L, B, T, H)
                mask = batch["attention_mask"][None, :, :, None].to(states.dtype)
                pooled = (states * mask).sum(2).float() / mask.sum(2).float()  # (L, B, H)
                _ = pooled.transpose(0, 1).cpu().numpy()
                n_tokens += int(batch["attention_mask"].sum())
                start += size
        _sync(device)
        return n_tokens

    run()  # warm-up
    return run


def full_batch_rate(encoder, device: str, rounds: int = 5) -> float:
    """Tokens/s of the model's own forward on full 64 x 256 batches, nothing copied out."""
    model = encoder.model
    ids = torch.randint(1000, 2000, (64, 256), device=device)
    with torch.inference_mode():
        model(input_ids=ids)
        _sync(device)
        started = time.perf_counter()
        for _ in range(rounds):
            model(input_ids=ids)
        _sync(device)
    return rounds * ids.numel() / (time.perf_counter() - started)


def measure_embed(folder: Path, dtype: str, texts: list[str], repeats: int, device: str) -> dict:
    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    started = time.perf_counter()
    encoder = lw.Encoder(folder, device=device, model_dtype=dtype, max_length=512)
    made_s = time.perf_counter() - started
    calls = []
    for _ in range(2):
        started = time.perf_counter()
        encoder.embed(texts, layers="all", pool="mean", progress=False)
        _sync(device)
        calls.append(time.perf_counter() - started)
    units = encoder.tokenize(texts)  # tokenised once, outside every timed call
    n_tokens = sum(len(unit) for unit in units)
    layers = tuple(range(encoder.n_hidden_states))
    engine = encoder.engine
    batches = length_sorted_batches(
        [len(u) for u in units], engine.batch_size, engine.max_tokens, padded=False
    )

    def packed_forward() -> int:  # layerwise's own forward and batches, from token ids, no host copy
        counted = 0
        with torch.inference_mode():
            for batch_ids in batches:
                columns = TokenColumns.of_units([units[u] for u in batch_ids])
                batch = engine.packed.prepare(
                    columns, with_token_types=engine.with_token_types, device=engine.device
                )
                engine.packed.forward(batch, layers)
                counted += sum(batch.lengths)
        _sync(device)
        return counted

    methods = {
        "embed": lambda: (encoder.embed(texts, layers="all", pool="mean", progress=False), n_tokens)[1],
        "pooled_loop": pooled_loop(folder, torch_dtype, texts, device),
        "extract_float16": lambda: sum(
            s.n_tokens for s in encoder.extract(texts, layers="all", dtype="float16", progress=False)
        ),
        "packed_forward": packed_forward,
    }
    times = interleaved_times(methods, repeats, n_tokens)
    rate = {k: round(n_tokens / statistics.median(v)) for k, v in times.items()}
    report = {
        "dtype": dtype, "texts": len(texts), "tokens": n_tokens, "tokens_per_s": rate,
        "limits": {"full_batch_forward_tokens_per_s": round(full_batch_rate(encoder, device)),
                   "pinned_d2h_gb_per_s": _rounded(pinned_bandwidth(device))},
        "first_call_s": round(calls[0], 3), "second_call_s": round(calls[1], 3),
        "first_over_second": round(calls[0] / calls[1], 2), "encoder_made_s": round(made_s, 2),
        "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
    }  # fmt: skip
    limits = report["limits"]
    print(f"BERT-base shape {dtype}, {len(texts)} texts, {n_tokens} tokens (tokens/s, medians of {repeats}):\n"
          f"  embed(layers='all')   {rate['embed']:>10,}  target >= 600,000 and >= 1.5 x the pooled loop "
          f"{rate['pooled_loop']:,} (= {rate['embed'] / rate['pooled_loop']:.2f})\n"
          f"  extract float16       {rate['extract_float16']:>10,}  target >= 0.8 x the packed forward "
          f"{rate['packed_forward']:,} (= {rate['extract_float16'] / rate['packed_forward']:.2f})\n"
          f"  limits: full-batch forward {limits['full_batch_forward_tokens_per_s']:,} tokens/s, pinned "
          f"device->host {limits['pinned_d2h_gb_per_s']} GB/s\n"
          f"  first call {calls[0]:.2f} s, second {calls[1]:.2f} s (target: first <= 2 x second)",
          flush=True)  # fmt: skip
    return report


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def measure_store(folder: Path, dtype: str, texts: list[str], repeats: int, device: str, work: Path) -> dict:
    """``lw.extract_to_store`` (every layer of every token, float16 on disk) beside the disk's own
    write bandwidth (dd with fsync) in the same folder, and a whole ``layerwise extract`` process on a
    one-line corpus (imports, CUDA, the model, the warm-up: what a command costs beyond its work)."""
    import shutil
    import subprocess
    import sys

    from cache_speed import write_bandwidth

    encoder = lw.Encoder(folder, device=device, model_dtype=dtype, max_length=512)
    lw.extract_to_store(encoder, texts[:64], work / "warm.lw", progress=False)
    seconds, written = [], 0
    for round_ in range(repeats):
        target = work / f"store-{round_}.lw"
        _sync(device)
        started = time.perf_counter()
        summary = lw.extract_to_store(encoder, texts, target, progress=False)
        _sync(device)
        seconds.append(time.perf_counter() - started)
        written = _folder_bytes(target)
        shutil.rmtree(target)
    disk_mb_s = write_bandwidth(work)
    store_mb_s = written / statistics.median(seconds) / 1e6
    one_line = work / "one.txt"
    one_line.write_text("A single line of text.\n", encoding="utf-8")
    command = [sys.executable, "-m", "layerwise", "extract", str(one_line), "-o", str(work / "one.npz"),
               "--model", str(folder), "--device", device, "--model-dtype", dtype, "--layers", "all"]  # fmt: skip
    process_s = []
    for _ in range(2):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        process_s.append(time.perf_counter() - started)
    report = {
        "dtype": dtype, "texts": len(texts), "tokens": summary.n_rows,
        "store_bytes": written, "store_seconds": [round(t, 3) for t in seconds],
        "store_mb_per_s": round(store_mb_s), "disk_write_mb_per_s": round(disk_mb_s),
        "store_share_of_disk": round(store_mb_s / disk_mb_s, 3),
        "one_line_process_s": [round(t, 2) for t in process_s],
    }  # fmt: skip
    print(f"BERT-base shape {dtype}: extract_to_store {store_mb_s:,.0f} MB/s written, the disk (dd, fsync) "
          f"{disk_mb_s:,.0f} MB/s (= {store_mb_s / disk_mb_s:.2f}; target >= 0.8)\n"
          f"  a whole `layerwise extract` on one line: {', '.join(f'{t:.1f}' for t in process_s)} s (target <= 5 s)",
          flush=True)  # fmt: skip
    return report
