"""Write the benchmark tables of the README and the docs from the result files they cite.

    python scripts/render_figures.py           # rewrite every rendered block in place
    python scripts/render_figures.py --check   # exit 1 naming each block that differs

A rendered block sits between ``<!-- figures: NAME -->`` and ``<!-- /figures -->`` in README.md or
a page of docs/ (a table, a sentence, a paragraph); :data:`BLOCKS` maps each NAME to the function
that writes it from ``benchmarks/results/*.json``. A figure inside a sentence of prose sits between
``<!-- fig: NAME -->`` and ``<!-- /fig -->``; :data:`FIGURES` maps its NAME to the function that
writes it. A passage with such figures says where they were measured with one more (a ``where-…``
name). Each block says where its figures were measured:
the machine, its cores, and the commit the run recorded. Every ratio is of two numbers of one run.
``tests/test_figures.py`` renders every block afresh and fails when a document differs: a figure
edited by hand, or a result file rerun without rendering again.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
STALE = 100  # commits: a result measured further back says so where it is shown
DOCUMENTS = (
    "README.md",
    "docs/benchmarks.md",
    "docs/internals.md",
    "docs/serving-limits.md",
    "docs/serving-performance.md",
    "docs/guide/analysis.md",
    "docs/guide/cache.md",
    "docs/guide/corpus.md",
    "docs/guide/cpu.md",
    "docs/guide/decoders.md",
    "docs/guide/probing.md",
    "docs/guide/ray.md",
    "docs/guide/reference-bert.md",
    "docs/guide/serving.md",
    "docs/guide/store.md",
    "docs/models.md",
)
# a block's lines keep the indentation of its opening marker (a table inside a list item)
BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)(?P<before>[^\n]*?)<!-- figures: (?P<name>[\w-]+) -->(?P<body>.*?)<!-- /figures -->",
    re.DOTALL | re.MULTILINE,
)

INLINE = re.compile(r"<!-- fig: (?P<name>[\w-]+) -->(?P<body>.*?)<!-- /fig -->")


@cache
def result(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))


# --- how figures are written ------------------------------------------------------------------------


def n(value: float) -> str:
    """A count or a rate: 8,086."""
    return f"{value:,.0f}"


def x(value: float, digits: int = 2) -> str:
    """A ratio: 1.71×."""
    return f"{value:.{digits}f}×"


def pct(value: float, digits: int = 0) -> str:
    """A fraction as a percentage: 0.69 -> 69 %."""
    return f"{value * 100:.{digits}f} %"


def s(value: float, digits: int = 2) -> str:
    """Seconds: 1.46 s."""
    return f"{value:.{digits}f} s"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def commit_of(data: dict[str, Any]) -> str:
    return data["machine"].get("commit") or data.get("recorded_in_commit") or "not recorded"


def cpu_of(data: dict[str, Any]) -> str:
    return cpu_words(data["machine"])


def cpu_words(machine: dict[str, Any]) -> str:
    """``2-core Intel Xeon``: a machine record's cores and CPU family."""
    cpu = machine["cpu"]
    short = "Intel Xeon" if "Xeon" in cpu else "AMD EPYC" if "EPYC" in cpu else cpu
    return f"{machine['cores']}-core {short}"


def gpu_of(data: dict[str, Any], part: str) -> str:
    gpu = data.get("gpu_by_part", {}).get(part, data.get("gpu", "a GPU"))
    return gpu.replace("NVIDIA ", "").replace(" 80GB HBM3", "")


@cache
def commits_since(commit: str) -> int | None:
    """How many commits HEAD is past ``commit`` (None outside a git clone, or a commit it lacks)."""
    span = f"{commit.rstrip('+')}..HEAD"
    counted = subprocess.run(["git", "rev-list", "--count", span], cwd=REPO, capture_output=True, text=True)
    return int(counted.stdout) if counted.returncode == 0 and counted.stdout.strip().isdigit() else None


def age(commit: str) -> str:
    """``commit`` and, where it is more than STALE commits behind HEAD, how far, in hundreds (a
    count that moves with every commit would make each commit re-render the docs)."""
    behind = commits_since(commit)
    if behind is None or behind <= STALE:
        return commit
    return f"{commit}, over {behind // 100 * 100} commits ago"


def where(name: str, part: str | None = None) -> str:
    """Where ``name``'s figures (of GPU ``part``) were measured, and at which commit: a stale one says
    how stale."""
    data = result(name)
    if part is not None:
        code = data.get("code", {}).get(part, "").split(":")[0]
        return f"one {gpu_of(data, part)}, code at {age(code or commit_of(data))}"
    return f"{cpu_of(data)}, {age(commit_of(data))}"


def measured(*names: str) -> str:
    """The sentence under a block: each result file, its machine and commit, its date."""
    parts = [f"`{name}.json`: {where(name)}, {result(name)['machine']['date']}" for name in names]
    return "Measured: " + "; ".join(parts) + "."


# --- README ------------------------------------------------------------------------------------------


def _loop_name(part: dict[str, Any]) -> str:
    return {"loop_32": "batches of 32", "loop_budget": "batches of 4,096 padded positions"}[
        part["fastest_loop"]
    ]


def headline() -> str:
    speed = result("packed_speed")
    mini, base = speed["default"], speed["bert_base"]
    return (
        f"the packed forward runs {x(mini['ratios']['default_over_fastest_loop'])} the fastest careful "
        "hand-written `transformers` loop on a CPU on a corpus of sentences and documents "
        f"({x(base['ratios']['default_over_fastest_loop'])} on a BERT-base-sized model; less where texts "
        "are short and alike, as the loop then pads little)"
    )


def readme_speed() -> str:
    speed = result("packed_speed")
    mini, base = speed["default"], speed["bert_base"]
    host, store, gpu = result("host_cost"), result("store_speed"), result("gpu_speed")
    gpu_rows = {(e["model"], e["dtype"]): e for e in gpu["extract"]}
    bert16, smol = gpu_rows["BERT-base shape", "float16"], gpu_rows["SmolLM2-135M shape", "bfloat16"]
    embed16, embed_bf = gpu["embed"]
    serve, decoder = result("serve_load"), result("decoder_speed")["smollm2"]
    at_32 = {lvl["clients"]: lvl for lvl in serve["layerwise"]["levels"]}[32]
    st_32 = {lvl["clients"]: lvl for lvl in serve["sentence_transformers"]["levels"]}[32]
    ray, io, cache_run, opened = (
        result("ray_scaling"),
        result("corpus_io"),
        result("cache_speed"),
        result("store_open"),
    )
    read = io["read"]
    caches = {m["model"]: m for m in cache_run["models"]}
    large, small = opened["stores"]["2000000"], opened["stores"]["10000"]
    plan_large, plan_small = io["ray"]["2,000,000 texts"], io["ray"]["100,000 texts"]
    full = io["full"]

    def loop(part: dict[str, Any]) -> str:
        rates = part["tokens_per_s"]
        return (
            f"fastest careful loop (plain transformers in its own process, sorted by token count, "
            f"{_loop_name(part)}): {n(rates[part['fastest_loop']])} "
            f"(**{x(part['ratios']['default_over_fastest_loop'])}**)"
        )

    rows = [
        [
            "every hidden state of every token, in memory",
            f"{n(mini['tokens_per_s'][mini['default']])} tokens/s",
            f"{loop(mini)}; sentence-transformers, last layer only: {n(mini['tokens_per_s']['st_tokens'])}",
            "`python benchmarks/packed_speed.py`",
            where("packed_speed"),
        ],
        [
            "the same, BERT-base shape (12 × 768)",
            f"{n(base['tokens_per_s'][base['default']])} tokens/s",
            loop(base),
            "`python benchmarks/packed_speed.py`",
            where("packed_speed"),
        ],
        [
            "the host's own work: sentence vectors of every layer with a model whose forward costs nothing",
            f"`embed` {x(host['figures']['embed']['x_floor'])} the time of the tokenizer plus the forward "
            "alone",
            f"a hand loop that pools in torch: **{x(host['embed_over_loop'])}** its speed",
            "`python benchmarks/host_cost.py`",
            where("host_cost"),
        ],
        [
            "a corpus to disk (fp16, every layer), whole process",
            f"{n(store['tokens_per_s']['layerwise extract -> store'])} tokens/s",
            f"best hand-written loop writing fp16 (sorted by token count): "
            f"{n(store['tokens_per_s']['best hand-written loop'])} (**{x(store['speedup_vs_best_loop'])}**)",
            "`python benchmarks/store_speed.py`",
            where("store_speed"),
        ],
        [
            "on a GPU: every hidden state, BERT-base shape, float16",
            f"{n(bert16['tokens_per_s']['layerwise'])} tokens/s (SmolLM2-135M shape, bfloat16: "
            f"{n(smol['tokens_per_s']['layerwise'])})",
            f"best hand-written GPU loop: {n(bert16['tokens_per_s']['best_loop'])} "
            f"(**{x(bert16['layerwise_over_best_loop'])}**; SmolLM2 shape: "
            f"{n(smol['tokens_per_s']['best_loop'])}, "
            f"**{x(smol['layerwise_over_best_loop'])}**)",
            "`python benchmarks/gpu_speed.py --part extract`",
            where("gpu_speed", "extract"),
        ],
        [
            "on a GPU: sentence vectors of every layer from strings, BERT-base shape, float16",
            f"{n(embed16['tokens_per_s']['embed'])} tokens/s (bfloat16: "
            f"{n(embed_bf['tokens_per_s']['embed'])}); a fresh Encoder's first call "
            f"{embed16['first_call_s']:.2f} s, its second {embed16['second_call_s']:.2f} s",
            f"the loop that pools on the GPU, from token ids: {n(embed16['tokens_per_s']['pooled_loop'])} "
            f"(**{x(embed16['tokens_per_s']['embed'] / embed16['tokens_per_s']['pooled_loop'])}**; bfloat16 "
            f"{x(embed_bf['tokens_per_s']['embed'] / embed_bf['tokens_per_s']['pooled_loop'])}); "
            "the packed forward "
            f"alone: {n(embed16['tokens_per_s']['packed_forward'])}",
            "`python benchmarks/gpu_speed.py --part embed`",
            where("gpu_speed", "embed"),
        ],
        [
            "only layer 2 of 12",
            f"{result('extract_speed')['layer2_fraction_of_all']:.2f} of the time of all layers",
            "",
            "`python benchmarks/extract_speed.py`",
            where("extract_speed"),
        ],
        [
            "served over HTTP, 32 clients",
            f"{n(at_32['tokens_per_s'])} tokens/s, {x(serve['served_over_offline_at_32'])} the offline rate",
            f"sentence-transformers behind FastAPI: {n(st_32['tokens_per_s'])} "
            f"(**{x(serve['layerwise_over_baseline_at_32'], 1)}**)",
            "`python benchmarks/serve_load.py --ratio-rounds 7`",
            where("serve_load"),
        ],
        [
            "a decoder LM, every hidden state: SmolLM2-135M (GGUF, float32)",
            f"{n(decoder['tokens_per_s']['layerwise_all'])} tokens/s; the middle layer alone: "
            f"{decoder['middle_time_over_all']:.2f} of the time",
            f"best hand-written loop (float32, its own process): {n(decoder['tokens_per_s']['best_loop'])} "
            f"(**{x(decoder['all_over_best_loop'], 1)}**)",
            "`python benchmarks/decoder_speed.py`",
            where("decoder_speed"),
        ],
        [
            "Ray, 2 actors × 1 thread",
            f"{x(ray['two_actors_1_thread']['ratio_to_one_process'])} one process on the same 2 cores",
            "",
            "`python benchmarks/ray_scaling.py` (in a loopback namespace)",
            where("ray_scaling"),
        ],
        [
            "reading a 10,000,000-line corpus (`--limit 50000 --layers 0`)",
            f"peak RSS {n(read['parquet 10,000,000 lines']['peak_rss_mib'])} MiB (`.parquet`), "
            f"{n(read['txt.gz 10,000,000 lines']['peak_rss_mib'])} MiB (`.txt.gz`)",
            f"the same on 100,000 lines: {n(read['parquet 100,000 lines']['peak_rss_mib'])}, "
            f"{n(read['txt.gz 100,000 lines']['peak_rss_mib'])} MiB",
            "`python benchmarks/corpus_io.py --part read`",
            where("corpus_io"),
        ],
        [
            "an activation cache for SAE training (3 layers, float16), SmolLM2-135M",
            f"{n(caches['SmolLM2-135M']['cache_tokens_per_s'])} tokens/s, "
            f"**{x(caches['SmolLM2-135M']['ratio'])}** "
            f"the forward alone (all-MiniLM-L6-v2: {x(caches['all-MiniLM-L6-v2']['ratio'])})",
            "the same layers computed in memory and thrown away: "
            f"{n(caches['SmolLM2-135M']['forward_tokens_per_s'])} "
            "tokens/s",
            "`python benchmarks/cache_speed.py`",
            where("cache_speed"),
        ],
        [
            "opening a store of 2,000,000 texts",
            f"{opened['open_seconds_large']:.3f} s; memory after open, `len`, `store[n-1]`, "
            "a 1,000-text slice: "
            f"as for 10,000 texts (×{opened['rss_large_over_small']:.3f})",
            f"reading its manifest whole: {large['whole_manifest']['read whole manifest']['seconds']:.1f} s, "
            f"{n(large['whole_manifest']['read whole manifest']['rss_mib'])} MiB against "
            f"{n(small['lazy']['imports']['rss_mib'])} MiB after imports",
            "`python benchmarks/store_open.py`",
            where("store_open"),
        ],
        [
            "the Ray driver on 2,000,000 texts (`--layers 0`)",
            f"peak RSS {n(plan_large['driver_peak_rss_mib'])} MiB; it plans (one pass over the corpus) in "
            f"{plan_large['plan_seconds']:.1f} s before any actor starts",
            f"on 100,000 texts: {n(plan_small['driver_peak_rss_mib'])} MiB, "
            f"{plan_small['plan_seconds']:.1f} s",
            "`python benchmarks/corpus_io.py --part ray`",
            where("corpus_io"),
        ],
        [
            f"{n(full['n_texts'])} texts, `.parquet` to sentence-level `.parquet`",
            f"median RSS {n(full['median_rss_last_third_mib'])} MiB in the last third",
            f"{n(full['median_rss_first_third_mib'])} MiB in the first third after a minute "
            f"(+{pct(full['growth_median'], 1)})",
            "`python benchmarks/corpus_io.py --part full`",
            where("corpus_io"),
        ],
    ]
    return table(["question", "layerwise", "baseline", "command", "measured on, commit"], rows)


# --- docs/benchmarks.md ---------------------------------------------------------------------------------


def extraction_setup() -> str:
    speed = result("packed_speed")
    mini, base = speed["default"], speed["bert_base"]
    subset = (
        "the whole corpus"
        if base["texts"] == mini["texts"]
        else f"a subset of {n(base['texts'])} texts, {n(base['tokens'])} tokens"
    )
    return (
        "`python benchmarks/packed_speed.py`: a mixed-length corpus from UD English EWT (train), single "
        f"sentences and whole documents, {n(mini['texts'])} texts, {n(mini['tokens'])} tokens, every hidden "
        f"state of every token; for the BERT-base shape (a random 12-layer `BertConfig()` model) {subset}. "
        f"Medians of 3 interleaved runs, on a {cpu_of(result('packed_speed'))} (fp32 matmul rate measured in "
        f"the run: {mini['matmul_gflops']:.0f} GFLOP/s, {base['matmul_gflops']:.0f} for the BERT-base part). "
        "Ceiling = the matmul rate ÷ the model's matmul FLOPs per token of this corpus (attention "
        "included). The hand-written loops run as the strongest baseline a careful user writes: each in a "
        "process of its own, the model loaded by plain transformers, warmed up on 16 texts as layerwise "
        "is, and only its timed pass counted (`benchmarks/handwritten_loops.py memory`); the careful loop "
        "sorts by token count and cuts batches of 32 texts, or of 4,096 padded positions, and the "
        "headline ratio is against whichever of the two was faster in the run."
    )


def extraction_table() -> str:
    speed = result("packed_speed")
    mini, base = speed["default"], speed["bert_base"]
    labels = {
        "tutorial": "tutorial loop: one text at a time, `output_hidden_states`, `torch.no_grad`",
        "chars_loop": "loop sorted by characters (as sentence-transformers sorts), batches of 32, "
        "`inference_mode`",
        "st_tokens": 'sentence-transformers `encode(output_value="token_embeddings")` (last layer only)',
        "loop_32": "careful loop: sorted by token count, batches of 32, `inference_mode`",
        "loop_budget": "careful loop: sorted by token count, batches of 4,096 padded positions, "
        "`inference_mode`",
        "layerwise_hf": "layerwise, Hugging Face padded forward (`packed=False`)",
        "packed_1_stream": "layerwise packed forward, one at a time (`concurrent_forwards=1`)",
        "packed_2_streams": "layerwise packed forward, two side by side (`concurrent_forwards=2`)",
    }

    def cells(part: dict[str, Any], key: str) -> list[str]:
        if key not in part["tokens_per_s"]:
            return ["(not run)", ""]
        bold = key in (part["default"], part["fastest_loop"])
        rate, share = n(part["tokens_per_s"][key]), pct(part["fraction_of_ceiling"][key])
        return [f"**{rate}**", f"**{share}**"] if bold else [rate, share]

    rows = [[label, *cells(mini, key), *cells(base, key)] for key, label in labels.items()]
    header = ["what", "all-MiniLM-L6-v2 tokens/s", "% of ceiling", "BERT-base shape tokens/s", "% of ceiling"]
    return table(header, rows) + "\n\n" + measured("packed_speed")


def extraction_ratios() -> str:
    speed = result("packed_speed")
    mini, base = speed["default"], speed["bert_base"]
    r, rb = mini["ratios"], base["ratios"]
    return (
        'Bold: what `Encoder().extract(texts, layers="all")` does by default for each model, and the '
        "faster of the two careful loops. On the default model that is "
        f"**{x(r['default_over_fastest_loop'])}** the fastest careful loop "
        f"({x(r['default_over_chars_loop'])} the loop sorted by characters), "
        f"{x(r['default_over_tutorial'], 1)} the tutorial loop, {x(r['default_over_st_tokens'])} "
        "sentence-transformers (which returns one layer, not "
        f"seven) and {x(r['default_over_layerwise_hf'])} the padded path; on the BERT-base shape "
        f"**{x(rb['default_over_fastest_loop'])}** the fastest careful loop and "
        f"{x(rb['default_over_layerwise_hf'])} "
        "the padded path."
    )


def concurrent_forwards() -> str:
    speed = result("packed_speed")

    def change(part: dict[str, Any]) -> str:
        gain = part["tokens_per_s"]["packed_2_streams"] / part["tokens_per_s"]["packed_1_stream"] - 1
        return f"{'+' if gain >= 0 else '−'}{abs(gain) * 100:.0f} %"

    return (
        f"{change(speed['default'])} on the default model against one at a time in this run, "
        f"{change(speed['bert_base'])} on the BERT-base shape"
    )


def host_cost_table() -> str:
    host = result("host_cost")
    figures, targets = host["figures"], host["targets"]
    labels = {
        "tokenizer": "the tokenizer's batch call alone (`encode_batch`, the model's truncation)",
        "forward": "the packed forward alone, every hidden state, on the engine's own batches",
        "loop": "a hand loop: one tokenizer call, sorted by token count, padded batches of 128, "
        "`output_hidden_states`, the masked mean of every hidden state in torch, one `.numpy()` a batch",
        "embed": '`embed(texts, layers="all", pool="mean")`',
        "embed_words": '`embed_words(texts, layers="all")`',
        "extract": '`extract(texts, layers="all", dtype="float16")`',
    }
    rows = []
    for key, label in labels.items():
        f = figures[key]
        floor = f"**{f['x_floor']:.2f}**" if key in targets else f"{f['x_floor']:.2f}"
        target = f"≤ {targets[key]}" if key in targets else ""
        rows.append([label, f"{f['seconds']:.3f}", n(f["tokens_per_s"]), floor, target])
    return (
        table(["what", "seconds", "tokens/s", "× the floor", "target"], rows) + "\n\n" + measured("host_cost")
    )


SHARE_KINDS = ("gemm", "attention", "gather_copy", "rest")


def roof_table() -> str:
    data = result("roof")
    rows = []
    for model, by_dtype in data["models"].items():
        for dtype, r in by_dtype.items():
            shares = dict(r["op_shares"])
            shares["rest"] = 1 - shares["gemm"] - shares["attention"] - shares["gather_copy"]
            rows.append([model, dtype, n(r["tokens_per_s"]["forward"]), pct(r["forward_over_gemms"]),
                         f"{r['gemm_gflops']:.0f} ({pct(r['gemm_gflops'] / r['machine_gflops'])})",
                         f"{r['forward_gemm_gflops']:.0f} (**{pct(r['forward_share_of_machine'])}**)",
                         f"{pct(r['extract_share_of_machine'])} ({r.get('extract_streams', 1)})",
                         f"{r['machine_gflops']:.0f}",
                         " / ".join(pct(shares[k]) for k in SHARE_KINDS)])  # fmt: skip
    header = ["model", "dtype", "forward tok/s", "its GEMMs alone, share of its time",
              "GEMMs alone GFLOP/s (of the machine)", "in the forward (of the machine)",
              "in `extract` (its concurrent forwards)",
              "machine GFLOP/s",
              "forward's CPU time: GEMM / attention / gathers and copies / the rest"]  # fmt: skip
    units = data["bf16_units"] or "none: float32 only"
    return table(header, rows) + f"\n\nbfloat16 matrix units: {units}. " + measured("roof")


SHOWN = {"bert-base": "BERT-base shape (random weights)"}


ROOF_TARGET = 0.85  # #76: extract at 85 % of the machine's GEMM rate


def roof_account() -> str:
    """What the 85 % target leaves the rest of the forward, beside what it takes in the run."""
    data = result("roof")
    parts = []
    for model, by_dtype in data["models"].items():
        r = by_dtype["float32"]
        ceiling = r["gemm_gflops"] / r["machine_gflops"]
        today = pct(1 - r["forward_over_gemms"])
        if ceiling <= ROOF_TARGET:
            parts.append(
                f"{model}: its GEMMs alone run at {pct(ceiling)} of the machine, under the target before "
                f"anything else runs (the rest takes {today} of the forward)"
            )
            continue
        parts.append(
            f"{model}: its GEMMs alone run at {pct(ceiling)} of the machine, so at most "
            f"{pct(1 - ROOF_TARGET / ceiling)} of the time may go elsewhere, against {today} in the forward"
        )
    pairs = [by_dtype["float32"]["machine_gflops_before_after"] for by_dtype in data["models"].values()]
    drift = ", ".join(f"{a:.0f} / {b:.0f}" for a, b in pairs)
    change = max(abs(a - b) / max(a, b) for a, b in pairs)
    return (
        f"At {pct(ROOF_TARGET)} of the machine's rate, the rest of a run (attention, norms, GELU, gathers, "
        f"and in `extract` the host's work) may take only what the GEMMs leave: {'; '.join(parts)}. On "
        f"this shared machine its own rate moves too: before / after each model's rounds, {drift} "
        f"GFLOP/s (up to {pct(change)} apart). {measured('roof')}"
    )


def bf16_fidelity_table() -> str:
    """Per hidden state and model: bfloat16's worst token cosine to float32, its relative error."""
    models = result("cpu_bf16")["models"]
    depth = max(len(m["states"]) for m in models.values())
    header, rows = ["hidden state"], []
    for model in models:
        header += [f"{SHOWN.get(model, model)}: worst token cosine", "relative error, median / worst"]
    for layer in range(depth):
        row = [str(layer)]
        for m in models.values():
            if layer < len(m["states"]):
                state = m["states"][layer]
                errors = f"{state['median_relative_error']:.2g} / {state['worst_relative_error']:.2g}"
                row += [f"{state['worst_cosine']:.5f}", errors]
            else:
                row += ["", ""]
        rows.append(row)
    sizes = ", ".join(f"{SHOWN.get(model, model)} {n(m['tokens'])}" for model, m in models.items())
    return table(header, rows) + f"\n\nTokens compared: {sizes}. " + measured("cpu_bf16")


def bf16_speed() -> str:
    """bfloat16 against float32 on the machine the fidelity was measured on."""
    data = result("cpu_bf16")
    rates, units = data["matmul_gflops"], data["bf16_units"]
    speeds = "; ".join(
        f"{SHOWN.get(model, model)} {n(m['tokens_per_s']['bfloat16'])} tokens/s against "
        f"{n(m['tokens_per_s']['float32'])} ({x(m['bf16_over_fp32'])})"
        for model, m in data["models"].items()
    )
    return (
        f"On a {cpu_of(data)} with {data['vector_units']} and "
        f"{'bfloat16 matrix units: ' + units if units else 'no bfloat16 matrix units'}, a 1,024² matrix "
        f"product runs at {rates['bfloat16']:.1f} GFLOP/s in bfloat16 against {rates['float32']:.0f} in "
        f"float32, and `extract` of every hidden state in bfloat16: {speeds}. "
        f"{measured('cpu_bf16')}"
    )


def host_rounds() -> str:
    host = result("host_cost")
    extract = host["rounds"]["extract"]
    return (
        f"`embed` runs **{x(host['embed_over_loop'])}** the hand loop "
        f"(target ≥ {x(host['loop_target'])}). The "
        "rounds of one call differ by up to half on this shared 2-core machine "
        f"(`extract`'s rounds: {min(extract):.3f} to {max(extract):.3f} s)"
    )


def host_stages_table() -> str:
    stages = result("host_cost")["stages_s"]
    columns = ["tokenise", "pack", "forward", "pool", "copy", "results", "other"]
    rows = [
        [f"`{call}`", *(f"{stages[call][c]:.3f}" if stages[call][c] else "0" for c in columns)]
        for call in ("embed", "embed_words", "extract")
    ]
    return table(["seconds under cProfile", *columns], rows)


def start_cost() -> str:
    data = result("start_cost")
    median, rounds = data["median_s"], data["seconds"]
    per_round = [e / i for e, i in zip(rounds["extract"], rounds["import"], strict=True)]
    return (
        f"`layerwise extract` of one line takes {median['extract']:.2f} s against {median['import']:.2f} s "
        f'for `python -c "import torch, transformers"` (medians of {data["rounds"]} rounds: '
        f"**{x(data['extract_over_import'])}**; target ≤ {x(data['target'], 1)}; the rounds' own ratios "
        f"run from {min(per_round):.2f} to {max(per_round):.2f}). Importing `AutoConfig` and "
        f"`AutoTokenizer` alone takes {median['registry']:.2f} s ({x(data['registry_over_import'])}). "
        + measured("start_cost")
    )


def writers_table() -> str:
    def row(name: str, label: str) -> list[str]:
        mb, share = result(name)["mb_per_s"], result(name)["share_of_dd"]
        bold = "**" if result(name)["crc"] == "fast" else ""  # the default
        return [
            f"{label}; `{name}.json`)",
            f"{n(mb['dd'])} MB/s",
            f"{n(mb['store'])} MB/s ({bold}{x(share['store'])}{bold})",
            f"{n(mb['cache'])} MB/s ({bold}{x(share['cache'])}{bold})",
        ]

    rows = [
        row("writer_speed", "zlib-ng's CRC-32 (the default"),
        row("writer_speed_zlib", "Python's zlib (`--crc zlib`"),
    ]
    return (
        table(["", "the disk (`dd`)", "store", "cache"], rows)
        + "\n\n"
        + measured("writer_speed", "writer_speed_zlib")
    )


def streamed_speed_table() -> str:
    data = result("streamed_speed")
    seconds, rates = data["seconds"], data["tokens_per_s"]
    labels = {"memory": "in memory", "streamed": "streamed, one block"}
    rows = [[label, f"{seconds[key]:.3f}", n(rates[key])] for key, label in labels.items()]
    return table(["", "seconds", "tokens/s"], rows) + "\n\n" + measured("streamed_speed")


def streamed_ratio() -> str:
    data = result("streamed_speed")
    rounds, cost = data["rounds"]["streamed"], data["cost_model"]
    return (
        f"Streamed runs at **{x(data['streamed_over_memory'], 3)}** the in-memory forward (target ≥ "
        f"{x(data['target'], 1)}). Its rounds took {min(rounds):.3f} to {max(rounds):.3f} s. The cost model "
        f"for one block: {cost['bytes_read_per_block'] / 1e6:.0f} MB read ({cost['page_cache_read_s']:.3f} s "
        f"from the page cache here) against {cost['flop_per_block'] / 1e12:.2f} TFLOP (at this machine's "
        f"{cost['matmul_gflops']:.1f} GFLOP/s), so the read is a small share of the compute"
    )


def streamed_memory_table() -> str:
    memory = result("streamed_speed")["memory"]
    runs = memory["runs"]
    rows = [
        ["in memory", f"{runs['memory']['growth_mb']:.1f} MB"],
        ["streamed, a quarter of the weights as its budget",
         f"**{runs['streamed']['growth_mb']:.1f} MB** (bound: {memory['bound_mb']:.1f} MB = two units' "
         f"weights + the block's activations + {memory['slack_mb']} MB)"],
    ]  # fmt: skip
    return table(["", "growth of the peak"], rows) + "\n\n" + measured("streamed_speed")


def family_table() -> str:
    data = result("family_speed")
    rows = []
    for family, entry in data["families"].items():
        rates, over = entry["tokens_per_s"], entry["over_best_loop"]
        rows.append(
            [
                f"`{family}`",
                n(rates["best_loop"]),
                n(rates["packed"]),
                n(rates["general"]),
                x(over["packed"]),
                x(over["general"]),
                x(entry["packed_over_general"]),
            ]
        )
    header = [
        "family",
        "best loop tok/s",
        "packed",
        "general",
        "packed / loop (target 1.2×)",
        "general / loop (target 0.95×)",
        "packed / general",
    ]
    return table(header, rows) + "\n\n" + measured("family_speed")


def sweep_counts() -> str:
    data = result("family_sweep")
    outcomes, reasons = data["outcomes"], data["refusals"]
    paths = ", ".join(f"{count} {path}" for path, count in sorted(data["equal_by_path"].items()))
    refused = "; ".join(f"{reason} {count}" for reason, count in sorted(reasons.items(), key=lambda r: -r[1]))
    wrong = sum(
        c for outcome, c in outcomes.items() if outcome not in ("equal", "refused", "skipped", "media")
    )
    media = outcomes.get("media", 0)
    return (
        f"With transformers {data['transformers']}: **{data['types']} types**, "
        f"{outcomes.get('equal', 0)} equal by both methods ({paths}), "
        + (f"{media} read from sound or images (the media tests), " if media else "")
        + f"{outcomes.get('refused', 0)} refused by name ({refused}), "
        f"{outcomes.get('skipped', 0)} skipped, **{wrong} wrong**. "
        f"`python benchmarks/family_sweep.py`: {where('family_sweep')}, {data['machine']['date']}."
    )


def hostile_counts() -> str:
    data = result("hostile_families")
    outcomes = data["outcomes"]
    return (
        f"**{n(data['cases'])} cases on {data['families']} families**: "
        f"{n(outcomes.get('equal', 0))} equal, {n(outcomes.get('refused', 0))} refused by name, "
        f"**{outcomes.get('wrong', 0)} wrong, {outcomes.get('traceback', 0)} tracebacks**; the largest "
        f"difference of an equal case {data['largest_difference']:.1e}. "
        f"`python benchmarks/hostile_families.py` ({data['seconds']:.0f} s): "
        f"{where('hostile_families')}, {data['machine']['date']}."
    )


def _fuzz_http_answers(statuses: dict[str, int], note: str = "") -> str:
    return ", ".join(f"{n(count)} × {status}" for status, count in sorted(statuses.items())) + note


# why an operation answered no 200 to the fuzzer, which serves the default (text, no masked-LM head) model
FUZZ_HTTP_REFUSED = {
    "/v1/explore/lens": " (the model has no masked-LM head)",
    "/v1/explore/media": " (the model reads text: this view takes an image or a sound model)",
}


def fuzz_http_table() -> str:
    """The answers of ``fuzz_http.py`` per operation: the parameterless GETs share one row. Its minutes
    stay in the file: a correctness run's, often beside other work, they are no speed figure."""
    data = result("fuzz_http")
    statuses = data["statuses"]
    plain = [op for op, got in statuses.items() if op.startswith("GET ") and sum(got.values()) == 1]
    rows = []
    for operation, got in statuses.items():
        if operation in plain:
            continue
        method, path = operation.split(" ", 1)
        name = f"`{method} {path.split(' (')[0]}`" + (" (npz)" if "x-npz" in path else "")
        note = FUZZ_HTTP_REFUSED.get(path, "") if "200" not in got else ""
        rows.append([name, n(sum(got.values())), _fuzz_http_answers(got, note)])
    if plain:
        names = ", ".join(f"`{op.split(' ', 1)[1]}`" for op in plain)
        answers = sorted({status for op in plain for status in statuses[op]})
        rows.append([f"`GET` {names}", "1 each (no parameters to vary)", ", ".join(answers)])
    total = (
        f"{len(data['failures'])} operations with a failing check and {data['server_errors']} server errors "
        f"in {n(data['requests'])} requests. "
    )
    return table(["operation", "requests", "answers"], rows) + "\n\n" + total + measured("fuzz_http")


def _fuzz_http_summary() -> str:
    data = result("fuzz_http")
    operations = sum("x-npz" not in operation for operation in data["statuses"])
    return (
        f"{n(data['requests'])} requests over the {operations} operations and `/v1/layers` as npz "
        f"({where('fuzz_http')}), **{len(data['failures'])} operations with a "
        f"failing check, {data['server_errors']} server errors**"
    )


def gpu_embed_table() -> str:
    gpu = result("gpu_speed")
    f16, bf16 = gpu["embed"]
    store = gpu["store"][0]
    r16, rbf = f16["tokens_per_s"], bf16["tokens_per_s"]

    def over(a: dict[str, float], b: dict[str, float], key: str, base: str) -> str:
        return f"**{x(a[key] / a[base])} / {x(b[key] / b[base])}**"

    rows = [
        [
            '`embed(layers="all", pool="mean")`, from strings',
            f"{n(r16['embed'])} tokens/s",
            n(rbf["embed"]),
            "the loop that pools on the GPU, from token ids: "
            f"{n(r16['pooled_loop'])} / {n(rbf['pooled_loop'])} "
            f"({over(r16, rbf, 'embed', 'pooled_loop')})",
        ],
        [
            '`extract(layers="all", dtype="float16")`, every token',
            n(r16["extract_float16"]),
            n(rbf["extract_float16"]),
            "layerwise's packed forward from token ids, nothing copied out: "
            f"{n(r16['packed_forward'])} / {n(rbf['packed_forward'])} "
            f"({over(r16, rbf, 'extract_float16', 'packed_forward')})",
        ],
        [
            "the model's forward, full batches of 64 × 256",
            n(f16["limits"]["full_batch_forward_tokens_per_s"]),
            n(bf16["limits"]["full_batch_forward_tokens_per_s"]),
            "—",
        ],
        [
            "a fresh Encoder's first `embed` / its second",
            f"{f16['first_call_s']:.2f} s / {f16['second_call_s']:.2f} s",
            f"{bf16['first_call_s']:.2f} s / {bf16['second_call_s']:.2f} s",
            "—",
        ],
        [
            "`extract_to_store`, every layer, float16 on disk",
            f"{n(store['store_mb_per_s'])} MB/s written",
            "",
            f"the disk: {n(store['disk_write_mb_per_s'])} MB/s (**{x(store['store_share_of_disk'])}**)",
        ],
        [
            "a whole `layerwise extract` on one line (BERT-base, `--model-dtype float16`)",
            f"{min(store['one_line_process_s']):.1f} s",
            "",
            "—",
        ],
        ["pinned device → host copy", f"{f16['limits']['pinned_d2h_gb_per_s']:.1f} GB/s", "", "—"],
    ]
    header = ["what", "float16 model", "bfloat16 model", "its limit, same run"]
    return (
        table(header, rows)
        + f"\n\nMeasured: `gpu_speed.json`, parts `embed` and `store`: {where('gpu_speed', 'embed')}."
    )


def gpu_groups_table() -> str:
    data = result("gpu_groups")
    by = {(r["dtype"], r["group_cost"]): r for r in data["rows"]}
    costs = sorted({r["group_cost"] for r in data["rows"]})
    cuda = 1 << 20  # GPU_GROUP_COST

    def label(cost: int) -> str:
        if cost == 4096:
            return "4,096 (the CPU's)"
        if cost == cuda:
            return f"**{n(cost)}** (CUDA's)"
        return "one grid a batch" if cost >= 1 << 40 else n(cost)

    rows = []
    for cost in costs:
        f16, bf16 = by["float16", cost], by["bfloat16", cost]
        cells = [n(r["tokens_per_s"][k]) for r in (f16, bf16) for k in ("packed_forward", "embed")]
        cells = [f"**{c}**" for c in cells] if cost == cuda else cells
        groups = ", ".join(str(g) for g in f16["groups_per_batch"])
        rows.append([label(cost), groups, cells[0], cells[1], cells[2], cells[3]])
    header = [
        "cost of a group (query-key pairs)",
        "groups in the 3 batches",
        "packed forward, float16",
        "`embed`, float16",
        "packed forward, bfloat16",
        "`embed`, bfloat16",
    ]
    return (
        table(header, rows)
        + f"\n\nMeasured: `gpu_groups.json`: one {data['gpu'].replace('NVIDIA ', '')}, "
        + (f"commit {commit_of(data)}.")
    )


def gpu_extract_table() -> str:
    gpu = result("gpu_speed")
    names = {
        ("all-MiniLM-L6-v2 shape", "float32"): "all-MiniLM-L6-v2 shape (6 × 384), float32",
        ("all-MiniLM-L6-v2 shape", "float16"): "the same, float16",
        ("BERT-base shape", "float32"): "BERT-base shape (12 × 768), float32",
        ("BERT-base shape", "float16"): "the same, float16",
        ("SmolLM2-135M shape", "bfloat16"): "SmolLM2-135M shape (30 × 576), bfloat16",
    }
    rows = []
    for i, entry in enumerate(gpu["extract"]):
        rates = entry["tokens_per_s"]
        unit = " tokens/s" if i == 0 else ""
        rows.append(
            [
                names[entry["model"], entry["dtype"]],
                f"{n(rates['best_loop'])}{unit}",
                n(rates["layerwise"]),
                f"**{x(entry['layerwise_over_best_loop'])}**",
                n(rates["forward_only"]),
                f"{n(entry['host_mb'])} MB",
            ]
        )
    header = ["model, compute dtype", "best loop", "layerwise", "ratio", "forward only", "float32 out"]
    return (
        table(header, rows)
        + f"\n\nMeasured: `gpu_speed.json`, part `extract`: {where('gpu_speed', 'extract')}."
    )


def store_table() -> str:
    data = result("store_speed")
    seconds, rates, share, start = (
        data[k] for k in ("seconds", "tokens_per_s", "share_of_matmul_peak", "startup_s")
    )
    tutorial, loop, ours = "one-at-a-time tutorial", "best hand-written loop", "layerwise extract -> store"
    labels = {
        tutorial: "one-at-a-time tutorial loop, fp16 to disk",
        loop: "best hand-written loop: batches of 32 sorted by token count, `inference_mode`, fp16 to disk",
        ours: "`layerwise extract corpus.txt -o corpus.lw`",
    }
    ratios = {
        tutorial: "1.00×",
        loop: x(seconds[tutorial] / seconds[loop]),
        ours: f"{x(data['speedup_vs_tutorial'])} (**{x(data['speedup_vs_best_loop'])}** the best loop)",
    }
    rows = [
        [
            label,
            f"{seconds[k]:.1f} s",
            n(rates[k]),
            pct(share[k]),
            f"**{start[k]:.2f} s**" if k == ours else f"{start[k]:.2f} s",
            ratios[k],
        ]
        for k, label in labels.items()
    ]
    header = ["what", "time", "tokens/s", "share of matmul peak", "start-up", "ratio"]
    return table(header, rows) + "\n\n" + measured("store_speed")


def store_rounds() -> str:
    data = result("store_speed")
    rounds = data["seconds_each_round"]
    loop, ours = rounds["best hand-written loop"], rounds["layerwise extract -> store"]
    rss = data["peak_rss_mib"]
    return (
        f"Rounds: best loop {' / '.join(f'{t:.1f}' for t in loop)} s, layerwise "
        f"{' / '.join(f'{t:.1f}' for t in ours)} s. The store takes "
        f"{data['store_bytes_per_token'] / 1024:.1f} "
        "KiB per token (7 × 384 float16 plus the manifest). Memory stays flat: the peak RSS of `layerwise "
        f"extract --layers 0` is {n(rss['10000'])} MiB for 10,000 texts and {n(rss['100000'])} MiB for "
        f"100,000 (+{pct(data['rss_growth'], 1)})"
    )


def store_open_table() -> str:
    stores = result("store_open")["stores"]
    steps = {
        "open": "`lw.open_store`",
        "len": "`len(store)`",
        "store[n-1]": "`store[n - 1]`",
        "1000-text slice": "`store[n // 2 : n // 2 + 1000]`",
        "ids[-1]": "`store.ids[-1]`",
    }

    def cell(size: str, part: str, step: str) -> str:
        figures = stores[size][part][step]
        grown = figures["rss_mib"] - stores[size][part]["imports"]["rss_mib"]
        return f"{figures['seconds']:.3f} s, +{grown:.1f} MiB"

    rows = [
        [label, cell("10000", "lazy", step), cell("2000000", "lazy", step)] for step, label in steps.items()
    ]
    whole = "read whole manifest"
    rows.append(
        [
            "the whole manifest (what opening read before)",
            cell("10000", "whole_manifest", whole),
            cell("2000000", "whole_manifest", whole),
        ]
    )
    parts = {size: stores[size]["manifest_parts"] for size in stores}
    header = [
        "step",
        f"10,000 texts ({parts['10000']} manifest parts)",
        f"2,000,000 texts ({parts['2000000']} parts)",
    ]
    return table(header, rows) + "\n\n" + measured("store_open")


def cache_table() -> str:
    rows = []
    for m in result("cache_speed")["models"]:
        rows.append(
            [
                f"{m['model']}, {n(m['tokens'])} tokens",
                f"{n(m['forward_tokens_per_s'])} tokens/s",
                f"{n(m['cache_tokens_per_s'])} tokens/s",
                f"**{x(m['ratio'])}**",
                f"{m['cache_mb_per_s']:.1f} MB/s",
                pct(m["disk_share"], 1),
            ]
        )
    header = ["model", "forward alone", "`layerwise cache`", "ratio", "written", "share of the disk"]
    return table(header, rows) + "\n\n" + measured("cache_speed")


def reference_table() -> str:
    data = result("reference_speed")
    seconds, rates = data["seconds"], data["tokens_per_s"]
    labels = {
        "hf_padded": "Hugging Face `BertModel`, padded batches, SDPA attention",
        "reference_padded": "reference `Bert`, padded, explicit softmax(QKᵀ/√d)V",
        "reference_packed": "reference `Bert.forward_packed`, unpadded",
    }
    rows = []
    for key, label in labels.items():
        ratio = x(rates[key] / rates["hf_padded"])
        rows.append(
            [
                label,
                f"{seconds[key]:.2f} s",
                n(rates[key]),
                f"**{ratio}**" if key == "reference_packed" else ratio,
            ]
        )
    return table(["what", "time", "tokens/s", "ratio"], rows) + "\n\n" + measured("reference_speed")


# --- docs/serving-performance.md -------------------------------------------------------------------------


def serve_headline() -> str:
    serve = result("serve_load")
    return (
        f"{x(serve['served_over_offline_at_32'])} the tokens/s of offline `Encoder().encode` at 32 "
        f"clients on 2 cores, and {x(serve['layerwise_over_baseline_at_32'], 1)} the rate of "
        "sentence-transformers behind a plain FastAPI endpoint"
    )


def _ms(value: float) -> str:
    return f"{value:.1f}" if value < 10 else n(value)


def serve_levels_table() -> str:
    """docs/guide/serving.md: each load level, layerwise beside sentence-transformers behind FastAPI."""
    data = result("serve_load")
    ours, theirs = data["layerwise"]["levels"], data["sentence_transformers"]["levels"]
    rows = []
    for a, b in zip(ours, theirs, strict=True):
        cells = [str(a["clients"])]
        for lvl in (a, b):
            rate = n(lvl["tokens_per_s"])
            rate = f"**{rate}**" if lvl is a and a["clients"] == 32 else rate
            cells += [n(lvl["requests_per_s"]), rate, f"{_ms(lvl['p50_ms'])} / {_ms(lvl['p99_ms'])}"]
        rows.append(cells)
    header = [
        "clients",
        "layerwise req/s",
        "tokens/s",
        "p50 / p99 ms",
        "sentence-transformers + FastAPI req/s",
    ]
    return table([*header, "tokens/s", "p50 / p99 ms"], rows) + "\n\n" + measured("serve_load")


def serve_against_st() -> str:
    data = result("serve_load")
    ours = {lvl["clients"]: lvl["tokens_per_s"] for lvl in data["layerwise"]["levels"]}
    theirs = {lvl["clients"]: lvl["tokens_per_s"] for lvl in data["sentence_transformers"]["levels"]}
    return (
        f"**{x(ours[32] / theirs[32])}** the tokens/s at 32 clients, {x(ours[8] / theirs[8], 1)} at 8, "
        f"{x(ours[1] / theirs[1], 1)} at one"
    )


def serve_ratio() -> str:
    data = result("serve_load")
    rounds = ", ".join(f"{r['ratio']:.2f}" for r in data["layerwise"]["ratio_rounds"])
    count = len(data["layerwise"]["ratio_rounds"])
    return f"**{x(data['served_over_offline_at_32'])}**, the median of {count} rounds ({rounds})"


def serve_soak() -> str:
    run = result("serve_load")["layerwise"]
    soak, errors = run["soak_rss_mib"], run["soak_errors"]
    return (
        f"RSS of both processes {n(min(soak))}–{n(max(soak))} MiB through a {run['soak_seconds']:.0f} s "
        f"soak at 32 clients after the levels (peak {n(run['peak_rss_mib'])} MiB), "
        f"{'no' if errors == 0 else errors} errors"
    )


def serve_offline() -> str:
    data = result("serve_load")
    client = max(lvl["client_cores"] for lvl in data["layerwise"]["levels"])
    return (
        f"The load client is plain asyncio on sockets and takes {client:.2f} of a core of the same 2 cores. "
        f"Offline `Encoder().encode` on the same texts: {n(data['offline_tokens_per_s'])} tokens/s"
    )


def serve_cores_table() -> str:
    levels = result("serve_load")["layerwise"]["levels"]
    rows = [
        [
            str(lvl["clients"]),
            f"{lvl['model_cores']:.2f}",
            f"{lvl['http_cores']:.2f}",
            f"{lvl['client_cores']:.2f}",
            f"{lvl['http_ms_per_request']:.2f}",
        ]
        for lvl in levels
    ]
    header = [
        "clients",
        "model process, cores",
        "HTTP process, cores",
        "load client, cores",
        "HTTP process, CPU ms per request",
    ]
    return table(header, rows) + "\n\n" + measured("serve_load")


def serve_small_runs() -> str:
    fits = result("gemm_speed")["forward_us_per_token"]
    one, mkl = fits["onednn"], fits["mkl"]
    return (
        f"On one thread a run costs about {one['fit']['fixed_ms']:.2f} ms whatever its size plus "
        f"{one['fit']['us_per_token']:.1f} µs per token with oneDNN ({mkl['fit']['fixed_ms']:.2f} ms plus "
        f"{mkl['fit']['us_per_token']:.1f} µs with MKL: least-squares fits over runs of 1 to 64 random "
        "texts, "
        f"`python benchmarks/gemm_speed.py`, {where('gemm_speed')}; the whole corpus at once: "
        f"{one['whole corpus']:.1f} µs per token)"
    )


def serve_rounds() -> str:
    rounds = [r["ratio"] for r in result("serve_load")["layerwise"]["ratio_rounds"]]
    return (
        f"the median of {len(rounds)} rounds is {result('serve_load')['served_over_offline_at_32']:.2f} "
        f"(rounds from {min(rounds):.2f} to {max(rounds):.2f})"
    )


def serve_memory() -> str:
    run = result("serve_load")["layerwise"]
    soak = run["soak_rss_mib"]
    return (
        f"RSS of both processes through a {run['soak_seconds']:.0f} s soak at 32 clients after the load "
        f"levels: {n(min(soak))}–{n(max(soak))} MiB (peak {n(run['peak_rss_mib'])} MiB), "
        f"{run['soak_errors']} errors"
    )


def serve_runs_table() -> str:
    levels = result("serve_load")["layerwise"]["levels"]
    rows = [
        [
            str(lvl["clients"]),
            n(lvl["requests_per_s"]),
            f"{lvl['requests_per_run']:.2f}",
            f"{lvl['run_ms']:.1f}",
            f"{lvl['queue_wait_ms']:.1f}",
            f"{lvl['p50_ms']:.3g}",
        ]
        for lvl in levels
    ]
    header = ["clients", "requests/s", "requests per run", "ms per run", "queue wait ms", "p50 ms"]
    return table(header, rows) + "\n\n" + measured("serve_load")


# --- docs/guide/analysis.md ------------------------------------------------------------------------------


def layer_rules() -> str:
    """Every rule's regret per kind and the ways of choosing, from the cases the result file keeps
    (the benchmark's own ``docs_table``, so the page and ``--rescore`` print the same table)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import label_free_layers

    cases = result("label_free_layers")["cases"]
    return (
        label_free_layers.docs_table(cases, label_free_layers.held_out(cases))
        + "\n\n"
        + measured("label_free_layers")
    )


_DECODER_MODELS = {
    "smollm2": "SmolLM2-135M-Instruct (GGUF, {layers} × {hidden_size})",
    "llama_1b_shape": "a random Llama of 1B shape (Llama 3.2 1B's: {layers} × {hidden_size}, 8 key/value "
    "heads), {texts} of the texts, {tokens:,} tokens",
}


def decoder_speed_table() -> str:
    """docs/guide/decoders.md: every hidden state of every token, the best hand-written loop against
    ``extract(layers="all")``, and the middle layer's share of the time."""
    data = result("decoder_speed")
    rows = []
    for key, what in _DECODER_MODELS.items():
        part, rate = data[key], data[key]["tokens_per_s"]
        middle = f"{part['middle_time_over_all']:.2f} of the time of all layers"
        ratio = f"**{x(part['all_over_best_loop'], 1)}**"
        loop, ours = (f"{n(rate[k])} tokens/s" for k in ("best_loop", "layerwise_all"))
        rows.append([what.format(**part), loop, ours, ratio, middle])
    header = ["model", "best hand-written loop", '`extract(layers="all")`', "ratio", "the middle layer only"]
    return table(header, rows) + "\n\n" + measured("decoder_speed")


def decoder_loop_costs() -> str:
    data = result("decoder_speed")
    small, large = data["smollm2"], data["llama_1b_shape"]
    seconds = statistics.median(large["seconds"]["best_loop"])
    return (
        f"sorted by characters instead it runs at {n(small['tokens_per_s']['chars_loop'])} and "
        f"{n(large['tokens_per_s']['chars_loop'])} tokens/s. What it loses: a batch holding a document "
        "pads the shorter texts beside it to the document's length, and every padded position costs as "
        f"much as a real one (on the 1B shape the loop spends most of its {seconds:.0f} s on the padding "
        "of the one batch that holds the documents)"
    )


_RAY_ROWS = {
    "two_actors_1_thread": "2 Ray actors × 1 thread (`--ray local --workers 2`)",
    "one_actor_2_threads": "1 Ray actor × 2 threads",
}


def ray_table() -> str:
    """docs/guide/ray.md: one process against Ray's actors on the same texts into a store."""
    data = result("ray_scaling")
    one = data["one_process_2_threads"]
    first = "one process, 2 torch threads (`lw.extract_to_store`)"
    rows = [[first, f"{one['seconds']:.1f} s", n(one["tokens_per_s"]), "1.00"]]
    for key, what in _RAY_ROWS.items():
        part = data[key]
        ratio = f"{part['ratio_to_one_process']:.2f}"
        rows.append([what, f"{part['seconds']:.1f} s", n(part["tokens_per_s"]), ratio])
    return table(["what", "time", "tokens/s", "ratio"], rows) + "\n\n" + measured("ray_scaling")


def ray_node_rate() -> str:
    return f"stored {n(result('ray_scaling')['two_actors_1_thread']['tokens_per_s'])} tokens/s under Ray"


def ray_100_nodes() -> str:
    rate = result("ray_scaling")["two_actors_1_thread"]["tokens_per_s"]
    hours = 2.2e9 / (rate * 100) / 3600  # 100M sentences of 22 tokens on 100 such nodes
    return f"at that rate 100 nodes take at most about {hours:.1f} h"


def _change(before: float, after: float) -> str:
    change = after / before - 1
    return f"{'+' if change >= 0 else '-'}{abs(change) * 100:.1f} %"


def corpus_io_table() -> str:
    """docs/guide/corpus.md: memory follows the block, not the corpus."""
    data = result("corpus_io")
    read, full, ray, speed = data["read"], data["full"], data["ray"], data["speed"]

    def rss(small: dict, large: dict, key: str = "peak_rss_mib") -> str:
        return f"{small[key]:.0f} vs {large[key]:.0f} MiB ({_change(small[key], large[key])})"

    reads = "; ".join(
        f"`.{kind}` {rss(read[f'{kind} 100,000 lines'], read[f'{kind} 10,000,000 lines'])}"
        for kind in ("parquet", "txt.gz")
    )
    first, last = full["median_rss_first_third_mib"], full["median_rss_last_third_mib"]
    flat = f"{first:.0f} vs {last:.0f} MiB ({_change(first, last)}); peak {full['peak_rss_mib']:.0f} MiB"
    driver = rss(ray["100,000 texts"], ray["2,000,000 texts"], "driver_peak_rss_mib")
    txt, parquet = speed["txt_s"], speed["parquet_s"]
    timed = f"{txt:.2f} s vs {parquet:.2f} s ({_change(txt, parquet)})"
    reading = (
        "Does reading follow the corpus? Peak RSS of `layerwise extract BIG --limit 50000 --layers 0 "
        "--pool sentence:mean -o x.parquet`, 100,000-line vs 10,000,000-line corpus"
    )
    whole = (
        f"Does the whole path stay flat? {n(full['n_texts'])} UD EWT sentences, `.parquet` to "
        "sentence-level `.parquet`, default model: median RSS in the first vs the last third of the run "
        "after its first minute"
    )
    driver_question = (
        "Does the Ray driver hold the corpus? Its peak RSS for `--ray local --layers 0`, 100,000 vs "
        "2,000,000 texts"
    )
    cost = (
        f"Does Parquet cost time? The same {n(speed['n_texts'])} texts through `extract_to_file` from "
        f"`.txt` and from `.parquet`, median of {len(speed['runs']['txt'])} alternating runs"
    )
    rows = [[reading, reads], [whole, flat], [driver_question, driver], [cost, timed]]
    return table(["question", "measured"], rows) + "\n\n" + measured("corpus_io")


def corpus_trim() -> str:
    trim = result("corpus_io")["trim"]
    ten, three = trim["versus_no_trim"]["every 10 s"], trim["versus_no_trim"]["every 3 s"]
    return (
        f"on {n(trim['n_texts'])} texts, every 10 s keeps the median RSS {pct(ten['rss_saved'])} under no "
        f"trimming for {pct(ten['time_cost'], 1)} more time; every 3 s would keep it "
        f"{pct(three['rss_saved'])} under for {pct(three['time_cost'], 1)}"
    )


def gpu_host_write() -> str:
    """docs/benchmarks.md: what the BERT-base float16 extraction writes into host memory, against the
    pinned copy's own rate."""
    gpu = result("gpu_speed")
    row = next(r for r in gpu["extract"] if r["model"] == "BERT-base shape" and r["dtype"] == "float16")
    rate = row["tokens_per_s"]["layerwise"]
    written = rate * (row["layers"] + 1) * row["hidden_size"] * 4 / 1e9
    pinned = gpu["embed"][0]["limits"]["pinned_d2h_gb_per_s"]
    return (
        f"With float32 results (the float16 model), {n(rate)} tokens/s is {written:.1f} GB/s of float32 "
        f"written into host memory; the pinned copy alone runs at {pinned:.1f} GB/s (on the "
        f"{gpu['gpu_by_part']['embed']})"
    )


def load_cost() -> str:
    data = result("load_and_cast")
    imported, loaded = data["modeling_import_s"]["transformers"], data["load_s"]
    return (
        f"{imported:.2f} s, and `from_pretrained` {loaded['transformers']:.2f} s in all, while layerwise's "
        f"light model loads all-MiniLM-L6-v2 in {loaded['layerwise light model']:.2f} s"
    )


def cast_cost() -> str:
    data = result("load_and_cast")
    cast, run = data["cast_ms_per_2048_tokens"], data["cast_s_per_store_run"]
    return (
        f"({cast['numpy']:.0f} ms per 2,048-token batch); torch's vectorised copy takes "
        f"{cast['torch, one thread']:.1f} ms and gives the same bits (tested, with subnormals, overflow "
        "and NaN). On one thread, because the concurrent forwards hold both cores: time in the cast while "
        f"`extract_to_store` writes the corpus above, {run['torch, one thread']:.2f} s on one thread, "
        f"{run['torch, two threads']:.2f} s on two, {run['numpy']:.2f} s with NumPy"
    )


def corpus_io_findings() -> str:
    """docs/benchmarks.md's reading-corpora findings, from corpus_io.json."""
    data = result("corpus_io")
    read, full, ray, speed, trim = (data[k] for k in ("read", "full", "ray", "speed", "trim"))
    small, large = ray["100,000 texts"], ray["2,000,000 texts"]
    versus = trim["versus_no_trim"]

    def lower(saved: float) -> str:  # a trim that saved nothing measures a little higher, in noise
        return f"{pct(saved)} lower" if saved >= 0 else f"{pct(-saved)} higher"

    trims = ", ".join(
        f"every {every} {lower(versus[f'every {every}']['rss_saved'])} for "
        f"{versus[f'every {every}']['time_cost'] * 100:+.1f} %"
        for every in ("3 s", "10 s", "30 s")
    )
    lines = [
        "- **Memory does not grow with the corpus.** Peak RSS of `layerwise extract BIG --limit 50000 "
        "--layers 0 --pool sentence:mean -o x.parquet`: from `.parquet` "
        f"{read['parquet 100,000 lines']['peak_rss_mib']:.0f} MiB on 100,000 lines and "
        f"{read['parquet 10,000,000 lines']['peak_rss_mib']:.0f} MiB on 10,000,000; from `.txt.gz` "
        f"{read['txt.gz 100,000 lines']['peak_rss_mib']:.0f} and "
        f"{read['txt.gz 10,000,000 lines']['peak_rss_mib']:.0f} MiB.",
        f"- **Parquet is as fast as text**: the same {n(speed['n_texts'])} texts from `.txt` and "
        f"`.parquet`, {len(speed['runs']['txt'])} alternating rounds, {speed['txt_s']:.2f} and "
        f"{speed['parquet_s']:.2f} s.",
        f"- **A long run's memory stays flat**: {n(full['n_texts'])} UD EWT sentences, `.parquet` to "
        f"sentence-level `.parquet`: median RSS {n(full['median_rss_first_third_mib'])} MiB in the first "
        f"third after the first minute, {n(full['median_rss_last_third_mib'])} MiB in the last "
        f"(+{pct(full['growth_median'], 1)}). Freed heap pages go back to the system every 10 s "
        f"(`malloc_trim`): against no trimming ({n(trim['n_texts'])} texts, two alternating rounds), "
        f"{trims}: most of what a trim returns is the forward's working set, faulted in again within "
        "seconds.",
        "- **The Ray driver** holds no corpus and reads it once: its peak RSS with `--ray local --layers 0` "
        f"is {small['driver_peak_rss_mib']:.0f} MiB for 100,000 texts and {large['driver_peak_rss_mib']:.0f} "
        f"MiB for 2,000,000 (+{pct(ray['growth'], 1)}), and it plans the shards (its one pass over the "
        f"corpus, and the table) in {small['plan_seconds']:.1f} and {large['plan_seconds']:.1f} s before "
        "any actor starts.",
    ]
    return "\n".join(lines) + "\n\n" + measured("corpus_io")


def label_free_cost() -> str:
    """docs/guide/analysis.md: what the label-free metrics cost, from the run that scored them."""
    data = result("label_free_layers")
    mini, smol = (data["models"][m] for m in ("all-MiniLM-L6-v2", "SmolLM2-135M-Instruct"))
    total = sum(sum(m["seconds"].values()) for m in data["models"].values())
    return (
        f"the five one-pass metrics of every hidden state, with the forward pass that feeds them, take "
        f"{mini['seconds']['one_pass_metrics_with_forward']:.1f} s for {n(data['settings']['texts'])} "
        f"sentences on all-MiniLM-L6-v2 and {smol['seconds']['one_pass_metrics_with_forward']:.1f} s on "
        f"SmolLM2 ({smol['n_hidden_states']} hidden states); the paper's scripts run the model once per "
        "layer, about (L+1)/2 forward passes. The view metrics add their forward passes "
        f"({data['settings']['views']} views: {mini['seconds']['view_metrics']:.1f} s and "
        f"{smol['seconds']['view_metrics']:.1f} s). The timed parts of the benchmark take "
        f"{total / 60:.0f} minutes ({where('label_free_layers')})"
    )


def _points(value: float | None) -> str:
    return "" if value is None else f"{value * 100:.1f}"


def probe_table() -> str:
    """docs/guide/probing.md: UPOS accuracy of every layer and fusion, with the controls."""
    data = result("probe_ud_ewt")
    rows_by = {r["name"]: r for r in data["rows"]}
    layers = [r for r in data["rows"] if r["kind"] == "layer" and r["name"].startswith("L")]
    rows = []
    for i, row in enumerate(layers):
        label = row["name"] + (" (embeddings)" if i == 0 else " (last)" if i == len(layers) - 1 else "")
        cells = [_points(row[k]) for k in ("accuracy", "random_model", "control_task", "selectivity")]
        if row["accuracy"] == max(r["accuracy"] for r in layers):
            label, cells[0] = f"**{label}**", f"**{cells[0]}**"
        rows.append([label, *cells])
    for names in (
        ("second_to_last",),
        ("sum_last4", "mean_last4"),
        ("concat_last4",),
        ("sum_all", "mean_all"),
    ):
        scores = {_points(rows_by[name]["accuracy"]) for name in names}
        same = len(scores) == 1
        for label, name in [(" = ".join(names), names[0])] if same else [(m, m) for m in names]:
            rows.append([label, _points(rows_by[name]["accuracy"]), "", "", ""])
    weights = " ".join(f"{w:.2f}" for w in data["scalar_mix_weights"])
    mix = f"weights {weights}, centre of gravity {data['center_of_gravity']:.2f}"
    rows.append(["scalar mix", _points(rows_by["scalar_mix"]["accuracy"]), mix, "", ""])
    header = ["features", "accuracy", "random model", "control task", "selectivity"]
    seconds = f"{data['seconds']:.0f} s"
    return table(header, rows) + "\n\n" + measured("probe_ud_ewt") + f" The run took {seconds}."


def probe_findings() -> str:
    data = result("probe_ud_ewt")
    layers = [r for r in data["rows"] if r["kind"] == "layer" and r["name"].startswith("L")]
    best = max(r["accuracy"] for r in layers)
    above = min(r["accuracy"] - r["random_model"] for r in layers)
    return (
        f"the last layer is {(best - layers[-1]['accuracy']) * 100:.1f} points below the best (this "
        "sentence-embedding model was tuned away from token-level syntax at the top), and every layer is at "
        f"least {above * 100:.1f} points above the random-model control"
    )


def before_after_table() -> str:
    """docs/benchmarks.md: the forward at one commit against an earlier one, rounds interleaved."""
    data = result("before_after")
    rows = []
    for name, case in data["cases"].items():
        median = case["median_seconds"]
        ratio = f"{case['after_over_before']:.3f}"
        after = f"{median['after']:.2f} s at {case.get('after', data['after'])}"
        peak = case.get("median_peak_mib")  # measured from the runs that kept it
        memory = "—" if peak is None else f"{peak['before']:,.0f} → {peak['after']:,.0f} MiB"
        rows.append([name, case["path"], f"{median['before']:.2f} s", after, ratio, memory])
    header = ["model (12 × 768)", "forward", f"at {data['before']}", "after", "after / before", "peak memory"]
    rounds = len(next(iter(data["cases"].values()))["seconds"]["before"])
    note = (
        f"Every hidden state of every token of {data['sentences']} UD EWT sentences, the best of three "
        f"extractions in a fresh process per round, {rounds} rounds alternating the commits; medians "
        "(peak memory: the process's peak resident set, where the run kept it)."
    )
    return note + "\n\n" + table(header, rows) + "\n\n" + measured("before_after")


def family_rows() -> str:
    """docs/models.md's table of the families, from the family table in the code
    (src/layerwise/_model/families/table.py): what runs how, not a measurement."""
    from layerwise._model.families.table import docs_rows

    header = ["model type", "example checkpoints", "path", "streaming", "taps", "final norm"]
    return table([*header, "tested against"], docs_rows())


def media_rows() -> str:
    """docs/models.md's table of the image families, from the media table in the code
    (src/layerwise/_model/families/media.py): what runs how, not a measurement."""
    from layerwise._model.families.media import media_docs_rows

    header = ["model type", "modality", "units", "example checkpoints"]
    return table(header, media_docs_rows())


def media_speed() -> str:
    """The guide "Images and audio": every layer of an image and a speech model, beside the
    hand-written loop (benchmarks/media_speed.py)."""
    data = result("media_speed")
    rows = []
    for modality, name in (("image", "ViT-base-sized"), ("audio", "HuBERT-base-sized")):
        part = data[modality]
        rates, inputs = part["tokens_per_s"], part["inputs_per_s"]
        rows.append(
            [
                f"{name}: {part['inputs']} {part['input']}",
                f"{inputs['layerwise']:.1f} ({rates['layerwise']:,.0f} units/s)",
                f"{inputs['loop']:.1f} ({rates['loop']:,.0f} units/s)",
                f"**{x(part['ratios']['layerwise_over_loop'])}**",
            ]
        )
    header = [
        "model, inputs",
        "layerwise extract, inputs/s",
        "hand-written loop, inputs/s",
        "layerwise / loop",
    ]
    note = (
        "Every hidden state of every unit kept on the host as float32, batches of "
        f"{data['image']['batch_size']}, {data['threads']} threads; the loop decodes the same files, runs the "
        "model's own processor and `output_hidden_states` under `torch.inference_mode`. "
        "`python benchmarks/media_speed.py`."
    )
    return table(header, rows) + "\n\n" + note + " " + measured("media_speed")


def integrity_table() -> str:
    """docs/benchmarks.md: each checked read beside the same read unchecked."""
    data = result("integrity_cost")
    t, rate, store = data["seconds"], data["throughput_mb_s"], data["store"]
    rows = [
        [
            f"one layer of every row, 8,192 rows at a time ({n(store['rows'])} rows)",
            f"`store.array(-1).iter_chunks()`: {s(t['store_rows_checked'])}",
            f"zarr `data[a:b, -1]`: {s(t['store_rows_unchecked'])}",
            x(data["ratios"]["bulk_rows_checked_over_unchecked"]),
        ],
        [
            f"every text as a LayerStack ({n(store['texts'])})",
            f"`store[:]`: {s(t['store_every_text'])}",
            "",
            "",
        ],
        [
            f"`verify_store` ({store['bytes'] / 1e6:.0f} MB, every check)",
            f"{s(t['verify_store'])}, {n(rate['verify_store'])} MB/s",
            "",
            "",
        ],
        [
            f"open a cache and read every activation ({data['cache_bytes'] / 1e6:.0f} MB)",
            f"`lw.load_cache`: {s(t['cache_load_cache_and_read'], 3)}",
            f"`datasets.load_from_disk`: {s(t['cache_load_from_disk_and_read'], 3)}",
            x(data["ratios"]["load_cache_over_load_from_disk"]),
        ],
        ["`verify_cache`", f"{s(t['verify_cache'], 3)}, {n(rate['verify_cache'])} MB/s", "", ""],
    ]
    return table(["read", "checked", "unchecked", "ratio"], rows) + "\n\n" + measured("integrity_cost")


def _cache_guide_speed() -> str:
    """docs/guide/cache.md: what caching costs against the forward alone, on the CPU and a GPU, and
    its peak memory."""
    cpu = {m["model"]: m for m in result("cache_speed")["models"]}
    smol, mini = cpu["SmolLM2-135M"], cpu["all-MiniLM-L6-v2"]
    gpu_data = result("gpu_speed")
    gpu = gpu_data["cache"][0]
    memory = result("cache_memory")
    (small, one), (large, other) = memory["runs"].items()
    return (
        f"SmolLM2-135M caches {n(smol['cache_tokens_per_s'])} tokens/s, **{x(smol['ratio'])}** its forward "
        f"alone ({n(smol['forward_tokens_per_s'])} tokens/s: the same contexts and layers computed and "
        f"thrown away); all-MiniLM-L6-v2 {n(mini['cache_tokens_per_s'])} tokens/s, {x(mini['ratio'])} "
        f"({n(mini['forward_tokens_per_s'])}). The forward binds: the cache writes "
        f"{smol['cache_mb_per_s']:.1f} and {mini['cache_mb_per_s']:.1f} MB/s, a few percent of the "
        f"{n(result('cache_speed')['write_bandwidth_mb_per_s'])} MB/s this disk takes with fsync "
        f"({where('cache_speed')}). On an {gpu_of(gpu_data, 'cache')} the forward is far faster "
        f"({n(gpu['forward_tokens_per_s'])} tokens/s, {gpu['model']}) and the cache runs at "
        f"{x(gpu['ratio'])} of it, writing {n(gpu['cache_mb_per_s'])} MB/s, {pct(gpu['disk_share'])} of "
        "that disk's "
        f"{n(gpu_data['write_bandwidth_mb_per_s'])} MB/s (`python benchmarks/gpu_speed.py --part cache`; "
        f"{where('gpu_speed', 'cache')}). Peak memory stays flat: {n(one['peak_rss_mib'])} MiB for "
        f"{int(small):,} tokens, {n(other['peak_rss_mib'])} MiB for {int(large):,} (`python "
        f"benchmarks/cache_memory.py`, a tiny Llama so that the cache's own work dominates; "
        f"{where('cache_memory')})"
    )


def decoder_layers_table() -> str:
    """docs/guide/decoders.md: SmolLM2's hidden states ranked on sentence pairs, as they are and
    through the final norm, beside the random-model twin."""
    data = result("decoder_layers")
    raw, normed = data["probe"], data["probe_final_norm_all"]
    raw_rows = {r["name"]: r for r in raw["rows"] if r["kind"] == "layer"}
    normed_rows = {r["name"]: r for r in normed["rows"] if r["kind"] == "layer"}
    names = list(raw_rows)
    last = names[-1]
    shown = [name for name in names if int(name[1:]) % 3 == 0 or name in (names[-2], last)]
    best_raw = max(names, key=lambda k: raw_rows[k]["score"])
    best_normed = max(names, key=lambda k: normed_rows[k]["score"])

    def cell(rows: dict[str, Any], name: str, best: str) -> str:
        value = f"{rows[name]['score']:.3f}"
        return f"**{value}**" if name == best else value

    rows = []
    for name in shown:
        label = name + (" (embeddings)" if name == "L0" else " (last)" if name == last else "")
        random = raw_rows[name]["random_model"]
        rows.append(
            [label, cell(raw_rows, name, best_raw), cell(normed_rows, name, best_normed), f"{random:.3f}"]
        )
    header = ["hidden state", "Spearman, as they are", 'Spearman, `final_norm="all"`', "random-model twin"]
    said = (
        f"{n(raw['n_dev'])} pairs, {raw['seconds']:.0f} s and {normed['seconds']:.0f} s for the two runs "
        f"(`benchmarks/results/decoder_layers.json` has every layer; the first run's curve is "
        f"`docs/images/decoder_layers.png`). As they are, the best hidden state is {best_raw} "
        f"({raw_rows[best_raw]['score']:.3f}); through the final norm, {best_normed} "
        f"({normed_rows[best_normed]['score']:.3f})."
    )
    return table(header, rows) + "\n\n" + said + "\n\n" + measured("decoder_layers")


_BOUNDS = {  # the largest request each endpoint admits under the default limits (not measured)
    "embeddings": "`/v1/embeddings`: 2,048 texts of 64 tokens (131,072 tokens)",
    "layers_json": "`/v1/layers` JSON: 4,672 tokens, every hidden state, float32 (63.9 MiB of base64)",
    "layers_npz": "`/v1/layers` npz: 6,208 tokens, every hidden state, float32",
    "explore_tokens": "`/v1/explore/tokens`: a 2,048-token text (windows)",
    "explore_attention": "`/v1/explore/attention`: a 2,048-token text",
}


def serve_bounds_table() -> str:
    """docs/serving-limits.md: each endpoint's largest request from 32 clients at once, and the
    peak memory of the two processes."""
    data = result("serve_bounds")
    idle = next(iter(data["endpoints"].values()))["idle_rss_mib"]
    rows = []
    for key, label in _BOUNDS.items():
        part = data["endpoints"][key]
        answered = ", ".join(f"{count} × {status}" for status, count in part["statuses"].items())
        peak = part["peak_rss_mib"]
        rows.append([label, answered, f"{n(peak['http'])} MiB", f"{n(peak['model'])} MiB"])
    header = [
        "endpoint, largest admitted request",
        "answered",
        "peak RSS, HTTP process",
        "peak RSS, model process",
    ]
    said = f"Idle: HTTP process {n(idle['http'])} MiB, model process {n(idle['model'])} MiB."
    return said + "\n\n" + table(header, rows) + "\n\n" + measured("serve_bounds")


BLOCKS: dict[str, Callable[[], str]] = {
    "serve-bounds": serve_bounds_table,
    "decoder-layers": decoder_layers_table,
    "headline": headline,
    "readme-speed": readme_speed,
    "extraction-setup": extraction_setup,
    "extraction": extraction_table,
    "extraction-ratios": extraction_ratios,
    "concurrent-forwards": concurrent_forwards,
    "host-cost": host_cost_table,
    "roof": roof_table,
    "roof-account": roof_account,
    "bf16-fidelity": bf16_fidelity_table,
    "bf16-speed": bf16_speed,
    "host-rounds": host_rounds,
    "host-stages": host_stages_table,
    "writers": writers_table,
    "start-cost": start_cost,
    "streamed-speed": streamed_speed_table,
    "streamed-ratio": streamed_ratio,
    "streamed-memory": streamed_memory_table,
    "families": family_table,
    "family-rows": family_rows,
    "media-rows": media_rows,
    "media-speed": media_speed,
    "before-after": before_after_table,
    "decoder-speed": decoder_speed_table,
    "ray": ray_table,
    "corpus-io": corpus_io_table,
    "corpus-trim": corpus_trim,
    "ray-node-rate": ray_node_rate,
    "ray-100-nodes": ray_100_nodes,
    "decoder-loop-costs": decoder_loop_costs,
    "sweep": sweep_counts,
    "hostile-families": hostile_counts,
    "fuzz-http": fuzz_http_table,
    "gpu-embed": gpu_embed_table,
    "gpu-groups": gpu_groups_table,
    "gpu-extract": gpu_extract_table,
    "gpu-host-write": gpu_host_write,
    "load-cost": load_cost,
    "cast-cost": cast_cost,
    "corpus-io-findings": corpus_io_findings,
    "store": store_table,
    "store-rounds": store_rounds,
    "store-open": store_open_table,
    "cache": cache_table,
    "reference": reference_table,
    "serve-headline": serve_headline,
    "serve-levels": serve_levels_table,
    "serve-against-st": serve_against_st,
    "serve-offline": serve_offline,
    "serve-ratio": serve_ratio,
    "serve-soak": serve_soak,
    "serve-cores": serve_cores_table,
    "serve-runs": serve_runs_table,
    "serve-small-runs": serve_small_runs,
    "serve-rounds": serve_rounds,
    "serve-memory": serve_memory,
    "layer-rules": layer_rules,
    "integrity": integrity_table,
    "cache-guide-speed": _cache_guide_speed,
    "label-free-cost": label_free_cost,
    "probe": probe_table,
    "probe-findings": probe_findings,
}


# --- figures inside sentences of prose ------------------------------------------------------------


def _span(values: Any, write: Callable[[float], str], joiner: str = "–") -> str:
    """The smallest and the largest of ``values``, each written by ``write``: 80–102."""
    values = list(values)
    return f"{write(min(values))}{joiner}{write(max(values))}"


def _gemm() -> dict[str, Any]:
    return result("gemm_speed")


def _crc(name: str) -> str:
    return n(result("writer_speed")["crc32_mb_per_s"][name])


def _gpu_embed(dtype: str = "float16") -> dict[str, Any]:
    return next(part for part in result("gpu_speed")["embed"] if part["dtype"] == dtype)


def _gpu_copy_rate() -> str:
    """What ``extract(dtype="float16")`` moves off the device: BERT-base's 13 states of 768 float16
    values a token (20 KB, on paper) at its measured rate, against the pinned copy's rate."""
    part = _gpu_embed()
    rate = part["tokens_per_s"]["extract_float16"] * 13 * 768 * 2 / 1e9
    return f"{rate:.1f} GB/s, 1/{part['limits']['pinned_d2h_gb_per_s'] / rate:.0f} of the pinned copy's rate"


def _gpu_loop_seconds() -> str:
    """The best loop's time against its forward's alone: BERT-base shape, float32 (medians)."""
    part = next(
        p
        for p in result("gpu_speed")["extract"]
        if p["model"] == "BERT-base shape" and p["dtype"] == "float32"
    )
    loop, forward = (statistics.median(part["seconds"][k]) for k in ("best_loop", "forward_only"))
    return f"{loop:.1f} s against {forward:.1f} s"


def _gpu_cache() -> str:
    data = result("gpu_speed")
    part = data["cache"][0]
    return (
        f"the disk writes {n(data['write_bandwidth_mb_per_s'])} MB/s with fsync, `dd`, in the same run): "
        f"{part['model']} {n(part['cache_tokens_per_s'])} tokens/s against {n(part['forward_tokens_per_s'])} "
        f"for the forward alone (**{x(part['ratio'])}**), writing {n(part['cache_mb_per_s'])} MB/s "
        f"({pct(part['disk_share'])} of the disk"
    )


def _decoders() -> str:
    data = result("decoder_speed")
    small, large = data["smollm2"], data["llama_1b_shape"]
    middle = {f"{part['middle_time_over_all']:.2f}" for part in (small, large)}
    return (
        f"extracts every hidden state at {n(small['tokens_per_s']['layerwise_all'])} tokens/s, "
        f"{x(small['all_over_best_loop'], 1)} the best hand-written loop "
        f"({n(small['tokens_per_s']['best_loop'])}: "
        "sorted by token count, plain transformers in its own process, float32), and a random Llama of 1B "
        f"shape at {n(large['tokens_per_s']['layerwise_all'])} tokens/s, {x(large['all_over_best_loop'], 1)} "
        f"({n(large['tokens_per_s']['best_loop'])}); the middle layer alone costs "
        f"{' and '.join(sorted(middle))} of the time of all layers ({where('decoder_speed')})"
    )


def _stop_early() -> str:
    data = result("extract_speed")
    return (
        f"On the BERT-base shape ({data['bert_base_texts']} texts), `layers=[2]` takes "
        f'**{data["layer2_fraction_of_all"]:.2f}** of the time of `layers="all"` '
        f"({s(data['bert_base_layer2_s'])} "
        f'against {s(data["bert_base_all_s"])}). The same script times `enc.extract(texts, layers="all")` '
        f"against the tutorial loop on the corpus above: {n(data['extract_tokens_per_s'])} against "
        f"{n(data['tutorial_loop_tokens_per_s'])} tokens/s ({x(data['speedup'])}; {where('extract_speed')})"
    )


def _store_cost() -> str:
    data = result("store_cost")
    one, four = data["copies_1"], data["copies_4"]

    def medians(part: dict[str, Any]) -> str:
        store, memory = (statistics.median(part[k]) for k in ("extract_to_store_s", "extract_s"))
        return f"{store:.2f} against {memory:.2f} s"

    return (
        f"{medians(one)}, **{x(one['ratio_median'], 3)}** (medians; best {x(one['ratio_best'], 3)}); "
        "with the "
        f"corpus four times over in each run (so that the writer's heap trims every "
        f"{data['trim_every_s']:.0f} s fall inside it), {medians(four)}, **{x(four['ratio_median'], 3)}** "
        f"({where('store_cost')})"
    )


def _store_open_memory() -> str:
    data = result("store_open")
    small, large = (int(k) for k in data["stores"])
    lazy = data["stores"][str(small)]["lazy"]
    first = lazy["store[n-1]"]["rss_mib"] - lazy["imports"]["rss_mib"]  # as the table counts it
    return (
        f"Memory after every step: ×{data['rss_large_over_small']:.3f} for {large // small} times the texts. "
        f"The first read's +{first:.0f} MiB"
    )


def _cache_memory() -> str:
    data = result("cache_memory")
    (small, one), (large, other) = data["runs"].items()
    return (
        f"{int(small):,} tokens in {s(one['seconds'], 1)}, peak RSS {n(one['peak_rss_mib'])} MiB; "
        f"{int(large):,} tokens ({other['cache_gb']:.2f} GB on disk) in {s(other['seconds'], 1)}, "
        f"{n(other['peak_rss_mib'])} MiB (**×{data['rss_large_over_small']:.3f}**; {where('cache_memory')})"
    )


def _flips(kind: str) -> tuple[dict[str, int], int]:
    """fault_injection.py's one-byte flips of every file of a ``kind`` ("store", "cache"): the count of
    each outcome (harmless, reported, silent, crashed), from the result's totals, and the files."""
    sweep = result("fault_injection")["sweep"]
    return sweep["totals"][kind], len(sweep[kind])


def _flip_sweep() -> str:
    """The one-byte flips of every file of a store and of a cache, and what each read made of them."""
    (store, _), (cache, _) = _flips("store"), _flips("cache")
    said = "all" if cache["reported"] == sum(cache.values()) else f"{cache['reported']:,}"
    return (
        f"of the store's {sum(store.values()):,} flips {store['reported']:,} were reported (a read raised "
        f"`StoreDamagedError`, `verify` said DAMAGED) and {store['harmless']:,} changed "
        f"nothing that is read; of the cache's {sum(cache.values()):,}, {said} were reported; "
        f"**{store['silent'] + cache['silent']} came back as numbers, {store['crashed'] + cache['crashed']} "
        f"crashed** ({where('fault_injection')})"
    )


def _fuzz() -> str:
    """The fuzzer's inputs and failures; its seconds stay in the file, as fuzz_http's minutes do."""
    data = result("fuzz_alignment")
    parts = data["tokenizers"].values()
    inputs = sum(sum(p["examples"].values()) for p in parts)
    failures = sum(len(p["failures"]) for p in parts)
    said = "no failure" if not failures else f"{failures} failures"
    return f"{inputs:,} inputs, {said} ({where('fuzz_alignment')})"


def _cache_guide_integrity() -> str:
    data = result("integrity_cost")
    t = data["seconds"]
    counts, files = _flips("cache")
    flips, reported, silent = sum(counts.values()), counts["reported"], counts["silent"]
    return (
        f"`lw.load_cache` followed by one pass over every activation takes "
        f"**{x(data['ratios']['load_cache_over_load_from_disk'])}** `datasets.load_from_disk` and the "
        f"same pass ({s(t['cache_load_cache_and_read'], 3)} against "
        f"{s(t['cache_load_from_disk_and_read'], 3)} for a "
        f"{data['cache_bytes'] / 1e6:.0f} MB cache, in the page cache); `verify_cache` reads "
        f"{n(data['throughput_mb_s']['verify_cache'])} MB/s ({where('integrity_cost')}). `python "
        f"benchmarks/fault_injection.py` flips one byte at a time in every file of a cache: "
        f"{f'all {flips:,}' if reported == flips else f'{reported:,} of {flips:,}'} flips in its "
        f"{files} files "
        f"(the record, the contexts, the shards, the index files) are reported, {silent or 'none'} read "
        "as numbers"
    )


def _store_guide_open() -> str:
    data = result("store_open")
    stores = data["stores"]
    small, large = sorted(stores, key=int)
    lazy, whole = stores[large]["lazy"], stores[large]["whole_manifest"]
    return (
        f"On this machine a {int(large):,}-text store opens in {s(lazy['open']['seconds'], 3)} "
        f"({int(small):,} texts: {s(stores[small]['lazy']['open']['seconds'], 3)}), and after open, `len`, "
        "`store[n-1]`, a 1,000-text slice and `store.ids[-1]` the process holds the same memory for either "
        f"({n(lazy['ids[-1]']['rss_mib'])} MiB, against {n(lazy['imports']['rss_mib'])} MiB after its "
        f"imports); reading that manifest whole, as opening did before, costs "
        f"{s(whole['read whole manifest']['seconds'], 1)} and takes the process to "
        f"{n(whole['read whole manifest']['rss_mib'])} MiB ({where('store_open')})"
    )


def _store_guide_integrity() -> str:
    data = result("integrity_cost")
    t, store = data["seconds"], data["store"]
    counts, files = _flips("store")
    silent = "none" if not counts["silent"] else f"{counts['silent']:,}"
    return (
        f"`store.array(-1).iter_chunks(8192)` over its {n(store['rows'])} rows takes "
        f"{s(t['store_rows_checked'])}, **{x(data['ratios']['bulk_rows_checked_over_unchecked'])}** zarr's "
        f"unchecked `data[a:b, -1]` ({s(t['store_rows_unchecked'])}): a checked read reads every layer of "
        "the rows to check them, where zarr reads one layer's bytes of an uncompressed chunk; every text as a "
        f"LayerStack (`store[:]`, {n(store['texts'])} texts) {s(t['store_every_text'])}; `verify` reads the "
        f"{store['bytes'] / 1e6:.0f} MB store at {n(data['throughput_mb_s']['verify_store'])} MB/s "
        f"({s(t['verify_store'])}; {where('integrity_cost')}). `python benchmarks/fault_injection.py` kills "
        "a run 20 times at random moments (the resumed store equals an uninterrupted one byte for byte), "
        "applies seven kinds of damage, and flips one byte at a time in every file of a store: of "
        f"{sum(counts.values()):,} flips in its {files} files, {counts['reported']:,} were reported and "
        f"{counts['harmless']:,} changed nothing (bytes of the last, partly filled shard past the committed "
        f"rows, and spacing in metadata files); **{silent} came back as numbers** "
        f"({where('fault_injection')})"
    )


def _flips_total() -> str:
    totals = [_flips(kind)[0] for kind in ("store", "cache")]
    flips = sum(sum(kind.values()) for kind in totals)
    silent = sum(kind["silent"] for kind in totals)
    return f"({flips:,} flips): {silent} read back as numbers"


def _startup() -> str:
    start = result("store_speed")["startup_s"]
    ours, loop = start["layerwise extract -> store"], start["best hand-written loop"]
    return f"{s(loop - ours, 1)} sooner than a hand-written loop that imports `AutoModel` ({s(ours)} vs {s(loop)}"


def _ray_driver() -> str:
    ray = result("corpus_io")["ray"]
    small, large = ray["100,000 texts"], ray["2,000,000 texts"]
    return (
        f"{small['driver_peak_rss_mib']:.0f} MiB for 100,000 texts, {large['driver_peak_rss_mib']:.0f} MiB for "
        f"2,000,000 (+{pct(ray['growth'], 1)}), planned in {small['plan_seconds']:.1f} and "
        f"{large['plan_seconds']:.1f} s before any actor starts ({where('corpus_io')})"
    )


def _ray_100_nodes_write() -> str:
    """The cluster's write rate on paper: the measured rate of a node, 100 nodes, 5,376 B a token."""
    rate = result("ray_scaling")["two_actors_1_thread"]["tokens_per_s"] * 5376
    return f"{rate * 100 / 1e9:.1f} GB/s across the cluster ({rate / 1e6:.0f} MB/s per node"


def _pretrain() -> str:
    data = result("pretrain_ud_ewt")
    held, docs = data["held_out"], data["documents"]
    return (
        f"{data['minutes']:.1f} min on 2 cores; {docs['held_out']} of {docs['held_out'] + docs['train']} "
        f"documents held out, {data['examples']['held_out']} held-out examples): held-out MLM accuracy "
        f"**{pct(held['mlm_accuracy'], 1)}** against {pct(held['mlm_baseline'], 1)} for always predicting the "
        f"most frequent token, NSP accuracy **{pct(held['nsp_accuracy'], 1)}** against 50 % "
        f"({where('pretrain_ud_ewt')})"
    )


def _duration(seconds: float) -> str:
    """1 h 5 min, or 12 min 40 s."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min {rest} s"


def _run_all_quick() -> str:
    """How long ``run_all.py --quick`` took, every script, some at once."""
    data = result("run_all")
    quick = data["quick"]
    return (
        f"{_duration(quick['seconds'])} ({len(quick['scripts'])} scripts, {quick['jobs']} at a time; "
        f"{cpu_words(quick)}, {age(quick['commit'])})"
    )


def _run_all_full() -> str:
    """How long the full runs took, one script at a time: the sum of each one's last full run, or
    how many have one."""
    data = result("run_all")
    full = data["full"]
    scripts = full["scripts"]
    machines = " and ".join(sorted({cpu_words(script) for script in scripts.values()}))
    if full["seconds"] is None:
        timed = sum(script["seconds"] for script in scripts.values())
        return f"over {_duration(timed)} for the {len(scripts)} scripts timed so far ({machines})"
    commits = sorted(
        {script["commit"] for script in scripts.values()}, key=lambda c: -(commits_since(c) or 0)
    )
    span = commits[0] if len(commits) == 1 else f"{commits[0]} to {commits[-1]}"
    return f"{_duration(full['seconds'])} ({len(scripts)} scripts, one at a time; {machines}, at {span})"


FIGURES: dict[str, Callable[[], str]] = {
    "run-all-full": _run_all_full,
    "run-all-quick": _run_all_quick,
    "pretrain": _pretrain,
    "ray-driver": _ray_driver,
    "ray-100-nodes-write": _ray_100_nodes_write,
    "readme-flips": _flips_total,
    "readme-checked-read": lambda: x(result("integrity_cost")["ratios"]["bulk_rows_checked_over_unchecked"]),
    "readme-checked-cache": lambda: x(result("integrity_cost")["ratios"]["load_cache_over_load_from_disk"]),
    "analysis-guide-seconds": lambda: s(result("analyze_speed")["seconds"], 1),
    "where-analysis-guide": lambda: where("analyze_speed"),
    "internals-gpu-range": lambda: _span(
        (p["layerwise_over_best_loop"] for p in result("gpu_speed")["extract"]), x
    ),
    "internals-import": lambda: s(result("load_and_cast")["modeling_import_s"]["transformers"], 1),
    "internals-startup": _startup,
    "store-guide-open": _store_guide_open,
    "store-guide-integrity": _store_guide_integrity,
    "cache-guide-integrity": _cache_guide_integrity,
    "fuzz-alignment": _fuzz,
    "fuzz-http-summary": _fuzz_http_summary,
    "flip-sweep": _flip_sweep,
    "analyze-seconds": lambda: f"{s(result('analyze_speed')['seconds'], 1)} ({where('analyze_speed')})",
    "store-open-memory": _store_open_memory,
    "cache-disk": lambda: f"{n(result('cache_speed')['write_bandwidth_mb_per_s'])} MB/s",
    "cache-memory": _cache_memory,
    "family-packed-over-general": lambda: _span(
        (f["packed_over_general"] for f in result("family_speed")["families"].values()), x
    ),
    "stop-early": _stop_early,
    "store-cost": _store_cost,
    "decoders": _decoders,
    "embed-vs-extract": lambda: x(result("embed_vs_extract")["median_ratio"]),
    "where-embed-vs-extract": lambda: where("embed_vs_extract"),
    "gpu-loop-seconds": _gpu_loop_seconds,
    "gpu-cache": _gpu_cache,
    "gpu-packed-against-full": lambda: "{:.2f}M against {:.2f}M".format(
        _gpu_embed()["tokens_per_s"]["packed_forward"] / 1e6,
        _gpu_embed()["limits"]["full_batch_forward_tokens_per_s"] / 1e6,
    ),
    "gpu-embed-over-loop": lambda: x(
        _gpu_embed()["tokens_per_s"]["embed"] / _gpu_embed()["tokens_per_s"]["pooled_loop"]
    ),
    "gpu-extract-rate": lambda: n(_gpu_embed()["tokens_per_s"]["extract_float16"]),
    "gpu-extract-copy": _gpu_copy_rate,
    "gpu-host-writers": lambda: "{} the disk for the store and {} for the cache".format(
        *(x(result("writer_speed_h200_host")["share_of_dd"][k]) for k in ("store", "cache"))
    ),
    "where-gpu-host-writers": lambda: where("writer_speed_h200_host"),
    "crc-zlib-ng": lambda: _crc("layerwise (zlib-ng)"),
    "crc-zlib": lambda: _crc("zlib"),
    "writers-disk": lambda: " and ".join(
        n(result(f)["mb_per_s"]["dd"]) for f in ("writer_speed", "writer_speed_zlib")
    ),
    "where-token-budget": lambda: where("token_budget"),
    "token-budget-default": lambda: " / ".join(n(v) for v in result("token_budget")["default"].values()),
    "token-budget-base": lambda: " / ".join(n(v) for v in result("token_budget")["bert_base"].values()),
    "where-gemm": lambda: where("gemm_speed"),
    "gemm-mkl": lambda: _span((c["mkl_gflops"] for c in _gemm()["linear_one_thread"].values()), n),
    "gemm-onednn": lambda: _span((c["onednn_gflops"] for c in _gemm()["linear_one_thread"].values()), n),
    "gemm-gain": lambda: _span(
        (c["onednn_gflops"] / c["mkl_gflops"] for c in _gemm()["linear_one_thread"].values()), x
    ),
    "gemm-onednn-us": lambda: n(_gemm()["forward_us_per_token"]["onednn"]["whole corpus"]),
    "gemm-mkl-us": lambda: n(_gemm()["forward_us_per_token"]["mkl"]["whole corpus"]),
    "gemm-new-count-ms": lambda: _span(
        (c["extra_ms_per_new_count"] for k, c in _gemm()["new_row_counts"].items() if k.startswith("onednn")),
        lambda v: f"+{v:.1f}",
        " to ",
    ),
}


def render(text: str) -> str:
    """``text`` with every block rendered afresh (a block keeps its layout: inline, or on lines)."""

    def fresh(match: re.Match[str]) -> str:
        name, indent = match["name"], match["indent"]
        if name not in BLOCKS:
            raise KeyError(f"no renderer for the block {name!r}: add one to BLOCKS in {Path(__file__).name}")
        inner = BLOCKS[name]()
        if match["body"].startswith("\n"):  # a block of lines: the markers on lines of their own
            # blank lines around it: Markdown reads a line after an HTML comment as more HTML
            lines = ["", *inner.split("\n"), ""]
            inner = "".join(f"\n{indent}{line}" if line else "\n" for line in lines) + f"\n{indent}"
        return f"{indent}{match['before']}<!-- figures: {name} -->{inner}<!-- /figures -->"

    return INLINE.sub(inline, BLOCK.sub(fresh, text))


def inline(match: re.Match[str]) -> str:
    """An inline figure written afresh."""
    name = match["name"]
    if name not in FIGURES:
        raise KeyError(
            f"no writer for the inline figure {name!r}: add one to FIGURES in {Path(__file__).name}"
        )
    return f"<!-- fig: {name} -->{FIGURES[name]()}<!-- /fig -->"


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args.add_argument("--check", action="store_true", help="change nothing; exit 1 if a document differs")
    check = args.parse_args().check
    stale = []
    for relative in DOCUMENTS:
        path = REPO / relative
        text = path.read_text(encoding="utf-8")
        fresh = render(text)
        if fresh != text:
            stale.append(relative)
            if not check:
                path.write_text(fresh, encoding="utf-8")
    verb = "differ from their result files" if check else "rendered"
    print(f"{', '.join(stale) or 'no document'} {verb}" if stale else "every document is as rendered")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
