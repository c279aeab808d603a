"""Build the layer explorer's built-in reference set: sentences of UD English EWT (CC BY-SA 4.0).

    python scripts/build_explorer_sample.py PATH/TO/UD_English-EWT

Writes src/layerwise/explore/data/ud_ewt_sample.tsv (sent_id <TAB> text) and copies the treebank's
licence next to it. The selection: up to 12 sentences (5..40 words) for each of a list of ambiguous
words (bank, play, book, interest, ... : the words whose senses separate layer by layer), then
random sentences of the same length range up to 400 in all; seeded, so the file is reproducible.
"""

from __future__ import annotations

import random
import re
import shutil
import sys
from pathlib import Path

AMBIGUOUS = [
    "bank", "banks", "play", "played", "plays", "book", "booked", "interest", "rate", "rates",
    "right", "light", "spring", "fair", "match", "run", "well", "kind", "mean", "present", "close",
    "bear", "bass", "river", "money", "fine", "check", "state", "order", "park",
]  # fmt: skip
PER_WORD, TOTAL, SEED = 12, 400, 0
OUT = Path(__file__).resolve().parents[1] / "src" / "layerwise" / "explore" / "data"


def sentences(folder: Path):
    for split in ("train", "dev", "test"):
        sent_id = None
        for line in (folder / f"en_ewt-ud-{split}.conllu").open(encoding="utf-8"):
            if line.startswith("# sent_id = "):
                sent_id = line[len("# sent_id = ") :].strip()
            elif line.startswith("# text = ") and sent_id:
                yield sent_id, line[len("# text = ") :].strip()


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    folder = Path(sys.argv[1])  # a UD English EWT release: the sample draws on all three splits
    pool = [(i, t) for i, t in sentences(folder) if 5 <= len(t.split()) <= 40 and "\t" not in t]
    rng = random.Random(SEED)
    rng.shuffle(pool)
    chosen: dict[str, str] = {}
    for word in AMBIGUOUS:
        pattern = re.compile(rf"\b{word}\b", re.IGNORECASE)
        hits = [(i, t) for i, t in pool if pattern.search(t)][:PER_WORD]
        chosen.update(hits)
    for i, t in pool:
        if len(chosen) >= TOTAL:
            break
        chosen.setdefault(i, t)
    OUT.mkdir(parents=True, exist_ok=True)
    rows = sorted(chosen.items())
    with (OUT / "ud_ewt_sample.tsv").open("w", encoding="utf-8") as handle:
        for sent_id, text in rows:
            handle.write(f"{sent_id}\t{text}\n")
    shutil.copyfile(folder / "LICENSE.txt", OUT / "UD_EWT_LICENSE.txt")
    print(f"{len(rows)} sentences -> {OUT / 'ud_ewt_sample.tsv'}")


if __name__ == "__main__":
    main()
