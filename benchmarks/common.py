"""What every benchmark shares: the corpus, the machine it ran on, its one result file, timing
(in this process and in fresh ones) and a served model to load.

Corpora are built from Universal Dependencies English EWT (CC BY-SA 4.0). The corpus is read from ``benchmarks/data/ud_ewt`` (committed: every train and dev sentence grouped
by document, and the UPOS columns the probe benchmark reads; see its README), or from the folder
named by the environment variable ``LAYERWISE_UD_EWT``: a UD English EWT release
(``en_ewt-ud-*.conllu``) or a folder laid out like the committed one.

A *mixed-length* corpus holds single sentences and whole documents (all sentences of one
``# newdoc``, joined by spaces), shuffled with a fixed seed: the mix real users feed an extractor.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import platform
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # benchmarks never download: the models are local

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# LAYERWISE_RESULTS_DIR sends what a run writes elsewhere (the smoke test's runs: the committed
# results stay as they were); reads fall back to the committed files
OUT = Path(os.environ["LAYERWISE_RESULTS_DIR"]) if os.environ.get("LAYERWISE_RESULTS_DIR") else RESULTS
UD_EWT = Path(os.environ.get("LAYERWISE_UD_EWT") or Path(__file__).resolve().parent / "data" / "ud_ewt")


def read_documents(split: str = "train") -> list[list[str]]:
    """Sentences grouped by document, in file order."""
    conllu = UD_EWT / f"en_ewt-ud-{split}.conllu"
    if conllu.exists():
        return conllu_documents(conllu)
    docs = UD_EWT / f"en_ewt-ud-{split}.docs.txt.gz"
    if not docs.exists():
        raise SystemExit(
            f"UD EWT {split} split not found in {UD_EWT} (neither {conllu.name} nor {docs.name}); "
            "set LAYERWISE_UD_EWT to a UD English EWT release folder"
        )
    text = gzip.decompress(docs.read_bytes()).decode("utf-8")
    return [block.split("\n") for block in text.strip("\n").split("\n\n") if block]


def conllu_documents(conllu: Path) -> list[list[str]]:
    """The sentences (``# text``) of a CoNLL-U file grouped by ``# newdoc``, in file order."""
    documents: list[list[str]] = []
    with conllu.open(encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("# newdoc"):
                documents.append([])
            elif line.startswith("# text = "):
                if not documents:
                    documents.append([])
                documents[-1].append(line[len("# text = ") :].rstrip("\n"))
    return [d for d in documents if d]


def upos_conllu(split: str) -> Path:
    """A CoNLL-U file of ``split`` with at least ID, FORM and UPOS (the probe benchmark's input):
    the release's own file, or the committed excerpt, unpacked into a temporary file."""
    import tempfile

    conllu = UD_EWT / f"en_ewt-ud-{split}.conllu"
    if conllu.exists():
        return conllu
    packed = UD_EWT / f"en_ewt-ud-{split}.upos.conllu.gz"
    if not packed.exists():
        raise SystemExit(f"UD EWT {split} split not found in {UD_EWT}; set LAYERWISE_UD_EWT")
    out = Path(tempfile.mkdtemp(prefix="lw-ud-")) / f"en_ewt-ud-{split}.conllu"
    out.write_bytes(gzip.decompress(packed.read_bytes()))
    return out


def mixed_corpus(n_sentences: int, n_documents: int, *, split: str = "train", seed: int = 0) -> list[str]:
    """``n_sentences`` single sentences and ``n_documents`` whole documents (of >= 5 sentences)."""
    rng = random.Random(seed)
    documents = read_documents(split)
    sentences = [s for doc in documents for s in doc]
    long_docs = [" ".join(doc) for doc in documents if len(doc) >= 5]
    corpus = rng.sample(sentences, n_sentences) + rng.sample(long_docs, n_documents)
    rng.shuffle(corpus)
    return corpus


@contextlib.contextmanager
def bert_base_folder() -> Iterator[Path]:
    """A randomly initialised 12-layer ``BertConfig()`` model (BERT-base shapes, seed 0) with the
    default model's WordPiece tokenizer, in a temporary folder removed afterwards."""
    import shutil
    import tempfile

    import torch
    from transformers import BertConfig, BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder = Path(tempfile.mkdtemp(prefix="lw-bert-base-"))
    try:
        torch.manual_seed(0)
        BertModel(BertConfig()).save_pretrained(folder)
        copy_default_tokenizer(folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- the machine and the result file ---------------------------------------------------------------


def copy_default_tokenizer(folder: Path) -> Path:
    """The packaged all-MiniLM-L6-v2's tokenizer files into ``folder`` (a random model's shapes
    with a real WordPiece vocabulary of 30,522 tokens)."""
    import shutil

    import layerwise as lw

    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(lw.default_model_path() / name, folder / name)
    return folder


def machine() -> dict[str, Any]:
    """What a figure depends on: CPU model, cores this process may use, torch, Python, the date."""
    import torch

    from layerwise._host.cpu import cpu_name, usable_cores

    return {
        "cpu": cpu_name(),
        "cores": usable_cores(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "commit": _commit(),
    }


def _commit() -> str | None:
    """The commit the code ran at (``+`` when the tree had uncommitted changes to anything but the
    result files and the figures, which a run writes), if in a git clone."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, check=True).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").strip()
        changed = git("status", "--porcelain", "--untracked-files=no").splitlines()
    except (OSError, subprocess.CalledProcessError):
        return None
    written = ("benchmarks/results/", "docs/images/")
    dirty = [line for line in changed if not line[3:].startswith(written)]
    return head + ("+" if dirty else "")


def figure_path(name: str) -> Path:
    """``docs/images/NAME``: a figure the docs show (under LAYERWISE_RESULTS_DIR when that is set, so
    that a run elsewhere, run_all --quick's, leaves the published figure as it is)."""
    return OUT / name if OUT != RESULTS else HERE.parent / "docs" / "images" / name


def result_path(name: str) -> Path:
    """``benchmarks/results/NAME.json``: the one result file of benchmark ``NAME`` (under
    LAYERWISE_RESULTS_DIR when that is set)."""
    return OUT / f"{name}.json"


def write_result(name: str, report: dict[str, Any], path: Path | None = None) -> Path:
    """Write ``report`` with the machine it ran on as the benchmark's one result file (a rerun
    overwrites it); ``path`` writes elsewhere (another machine's run, kept beside the figures)."""
    path = path or result_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine(), **report}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return path


def read_result(name: str) -> dict[str, Any]:
    """The last result of ``name`` (for benchmarks that rerun one part and keep the others)."""
    path = result_path(name)
    path = path if path.exists() else RESULTS / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser whose help is the script's docstring."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


# --- timing ----------------------------------------------------------------------------------------


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    """The fastest of ``repeats`` calls, in seconds (after the caller's warm-up)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def interleaved_times(
    methods: dict[str, Callable[[], Any]],
    repeats: int,
    expected: int,
    after_round: Callable[[], object] | None = None,
) -> dict[str, list[float]]:
    """Seconds of each method, ``repeats`` rounds of all methods in turn (a slow spell of this shared
    machine hits every contender alike); each call returns the tokens it counted, which must be
    ``expected``, or ``(tokens, seconds)`` when it timed itself (a loop in a process of its own:
    :func:`fresh_loop`). ``after_round`` runs after each round (e.g. measure the matmul rate again)."""
    times: dict[str, list[float]] = {key: [] for key in methods}
    for _ in range(repeats):
        for key, fn in methods.items():
            start = time.perf_counter()
            counted = fn()
            elapsed = time.perf_counter() - start
            if isinstance(counted, tuple):
                counted, elapsed = counted
            times[key].append(elapsed)
            assert counted == expected, (key, counted, expected)
        if after_round is not None:
            after_round()
    return times


def timed_process(command: Sequence[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    """Wall time and peak RSS (KiB) of ``command`` in a fresh process, measured by a wrapper whose
    only child it is (start-up, imports and model loading included, as a user pays them)."""
    wrapper = (
        "import resource, subprocess, sys, time\n"
        "t = time.perf_counter(); subprocess.run(sys.argv[1:], check=True)\n"
        "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", wrapper, *command],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    seconds, rss = out.stdout.split()[-2:]
    return float(seconds), int(rss)


def matmul_rates(size: int = 2048, repeats: int = 5) -> tuple[float, float]:
    """fp32 ``size``^2 matrix-multiply GFLOP/s with torch's own threads on its two CPU libraries:
    MKL (``a @ b``) and oneDNN with the right-hand matrix prepacked (what the packed forward uses:
    src/layerwise/_model/forward/cpu_gemm.py); 0 for oneDNN in a torch without it."""
    import torch

    from layerwise._model.forward.cpu_gemm import onednn_linear, prepack

    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    flop = 2 * size**3 / 1e9
    mkl = flop / best_of(repeats, lambda: a @ b)
    try:
        packed = prepack(b.T.contiguous())
        onednn_linear(a, packed, None)
    except (AttributeError, RuntimeError):  # a torch without oneDNN
        return mkl, 0.0
    return mkl, flop / best_of(repeats, lambda: onednn_linear(a, packed, None))


def matmul_gflops(size: int = 2048, repeats: int = 5) -> float:
    """The machine's fp32 matrix-multiply rate with torch's own threads (GFLOP/s): the better of
    torch's two CPU libraries. On AMD processors MKL takes its AVX2 path and runs at less than half
    of oneDNN's rate (benchmarks/gemm_speed.py)."""
    return max(matmul_rates(size, repeats))


def best_matmul_rate(dtype: Any, size: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of a ``size``² matrix product in ``dtype`` (a torch dtype) with torch's threads: the
    fastest of ``a @ b``, ``F.linear`` and oneDNN's prepacked linear (the best of ``repeats`` each).
    For bfloat16 ``F.linear`` takes oneDNN's path where ``@`` may not."""
    import torch
    import torch.nn.functional as F

    from layerwise._model.forward.cpu_gemm import onednn_linear, prepack

    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    flop = 2 * size**3 / 1e9
    weight = b.T.contiguous()
    rates = [flop / best_of(repeats, lambda: a @ b), flop / best_of(repeats, lambda: F.linear(a, weight))]
    try:
        packed = prepack(weight)
        onednn_linear(a, packed, None)
        rates.append(flop / best_of(repeats, lambda: onednn_linear(a, packed, None)))
    except (AttributeError, RuntimeError):  # no oneDNN, or not for this dtype
        pass
    return max(rates)


def model_gflop(config: Any, lengths: list[int]) -> float:
    """Forward FLOPs of a BERT encoder over sequences of the given lengths (matmuls only)."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    per_token = 2 * (4 * h * h + 2 * h * inter)  # Q, K, V, output projections; FFN in and out
    attention = sum(2 * 2 * n * n * h for n in lengths)  # Q K^T and P V
    return layers * (per_token * sum(lengths) + attention) / 1e9


def tutorial_loop(tokenizer: Any, model: Any, texts: list[str]) -> int:
    """What most tutorials do: one text at a time, output_hidden_states, stack to NumPy."""
    import torch

    n_tokens = 0
    with torch.no_grad():
        for text in texts:
            inputs = tokenizer(text, return_tensors="pt", truncation=True, max_length=512)
            outputs = model(**inputs, output_hidden_states=True)
            hidden = torch.stack(outputs.hidden_states)[:, 0].numpy()  # (layers, tokens, hidden)
            n_tokens += hidden.shape[1]
    return n_tokens


def fresh_loop(
    model: str, texts: list[str], *, order: str = "tokens", batches: str = "fixed"
) -> Callable[[], tuple[int, float]]:
    """The best hand-written loop, in a process of its own with the model loaded by plain
    transformers (benchmarks/handwritten_loops.py memory): batches of 32 sorted by token count
    (``order="chars"``: by characters, as sentence-transformers sorts; ``batches="budget"``: as many
    texts a batch as 4,096 padded positions hold), warmed up as layerwise is.
    Each call starts a fresh process and returns ``(tokens, seconds of its timed pass)``."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="lw-loop-"))
    corpus = folder / "texts.json"
    corpus.write_text(json.dumps(texts), encoding="utf-8")

    def run() -> tuple[int, float]:
        out = subprocess.run(
            [sys.executable, str(HERE / "handwritten_loops.py"), "memory", str(corpus), "-", "--model", model,
             "--order", order, "--batches", batches],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        result = json.loads(out.stdout.strip().splitlines()[-1])
        return int(result["tokens"]), float(result["seconds"])

    return run


# --- a served model --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def process_tree(pid: int) -> list[int]:
    """The server and the processes any of its threads started (the model process)."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return [pid, *children]


def rss_tree_kib(pid: int, field: str = "VmRSS") -> int:
    return sum(rss_kib(p, field) for p in process_tree(pid))


def start(command: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a server on 127.0.0.1:``port`` and wait (at most 120 s) until /health answers 200."""
    import httpx

    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited: {process.stderr.read() if process.stderr else ''}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.25)
    process.kill()
    raise SystemExit("server did not start in 120 s")


def serve_command(port: int, options: Sequence[str] = ()) -> list[str]:
    """`layerwise serve` on 127.0.0.1:``port``, on the CPU, with extra ``options``."""
    command = [sys.executable, "-m", "layerwise.cli", "serve", "--port", str(port), "--device", "cpu"]
    return [*command, *options]


def start_serve(
    options: Sequence[str] = (), env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """`layerwise serve` started on a free port and answering /health: (process, base url)."""
    port = free_port()
    return start(serve_command(port, options), port, env), f"http://127.0.0.1:{port}"
