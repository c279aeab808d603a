"""Copy the parts of UD English EWT (CC BY-SA 4.0) that the tests and benchmarks read into the repository.

    python scripts/vendor_ud_ewt.py PATH/TO/UD_English-EWT

PATH is a release of https://github.com/UniversalDependencies/UD_English-EWT (the folder holding
``en_ewt-ud-{train,dev,test}.conllu``, ``LICENSE.txt`` and ``README.md``). Writes:

* ``tests/data/ud_ewt/en_ewt-ud-dev.sentences.txt``: the first 500 sentences of the dev split, one
  per line (the only part of the treebank the tests read);
* ``benchmarks/data/ud_ewt/en_ewt-ud-{train,dev}.docs.txt.gz``: every sentence, one per line, a
  blank line between documents (``# newdoc``): the benchmarks' mixed-length corpora;
* ``benchmarks/data/ud_ewt/en_ewt-ud-{train,dev}.upos.conllu.gz``: the first 3,000 training and all
  dev sentences, with only the columns a part-of-speech probe reads (ID, FORM, UPOS; the others
  ``_``): the UPOS probe benchmark;

and the treebank's licence and attribution beside each. The output is a pure function of the
release, so the committed files can be checked against it.
"""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import conllu_documents  # noqa: E402  (how the benchmarks read a release)

TESTS = ROOT / "tests" / "data" / "ud_ewt"
BENCHMARKS = ROOT / "benchmarks" / "data" / "ud_ewt"
TEST_SENTENCES = 500
PROBE_TRAIN_SENTENCES = 3000

ATTRIBUTION = """\
# UD English EWT (excerpts)

Universal Dependencies English Web Treebank v2.15,
https://github.com/UniversalDependencies/UD_English-EWT

Annotations (c) 2013-2021 The Board of Trustees of The Leland Stanford Junior University, licensed
under Creative Commons Attribution-ShareAlike 4.0 International (LICENSE.txt here). The underlying
texts come from the LDC English Web Treebank (LDC2012T13).

What is here, and how it was made: {what}. Regenerate with
`python scripts/vendor_ud_ewt.py PATH/TO/UD_English-EWT`.
"""


def upos_only(conllu: Path, limit: int | None) -> str:
    """The sentences of ``conllu`` with ID, FORM and UPOS kept and the other seven columns ``_``."""
    out: list[str] = []
    n = 0
    with conllu.open(encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("# text = ") or line.startswith("# sent_id = "):
                out.append(line)
            elif line.strip() == "":
                if out and out[-1] != "\n":
                    out.append("\n")
                    n += 1
                    if limit is not None and n >= limit:
                        break
            elif not line.startswith("#"):
                cols = line.rstrip("\n").split("\t")
                out.append("\t".join([cols[0], cols[1], "_", cols[3], *["_"] * 6]) + "\n")
    return "".join(out)


def write_gzip(path: Path, text: str) -> None:
    # mtime=0 and no file name in the header: the same input gives the same bytes
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as handle:
        handle.write(text.encode("utf-8"))


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    ud = Path(sys.argv[1])
    TESTS.mkdir(parents=True, exist_ok=True)
    BENCHMARKS.mkdir(parents=True, exist_ok=True)
    dev = [s for doc in conllu_documents(ud / "en_ewt-ud-dev.conllu") for s in doc][:TEST_SENTENCES]
    (TESTS / "en_ewt-ud-dev.sentences.txt").write_text("\n".join(dev) + "\n", encoding="utf-8")
    for split in ("train", "dev"):
        docs = conllu_documents(ud / f"en_ewt-ud-{split}.conllu")
        write_gzip(
            BENCHMARKS / f"en_ewt-ud-{split}.docs.txt.gz", "\n\n".join("\n".join(d) for d in docs) + "\n"
        )
        limit = PROBE_TRAIN_SENTENCES if split == "train" else None
        write_gzip(
            BENCHMARKS / f"en_ewt-ud-{split}.upos.conllu.gz",
            upos_only(ud / f"en_ewt-ud-{split}.conllu", limit),
        )
    for folder, what in (
        (TESTS, f"the first {TEST_SENTENCES} sentences of the dev split, one per line"),
        (
            BENCHMARKS,
            "every sentence of the train and dev splits, one per line, documents separated by a blank "
            f"line (*.docs.txt.gz); the first {PROBE_TRAIN_SENTENCES:,} training and all dev sentences "
            "in CoNLL-U with only ID, FORM and UPOS kept (*.upos.conllu.gz)",
        ),
    ):
        shutil.copyfile(ud / "LICENSE.txt", folder / "LICENSE.txt")
        (folder / "README.md").write_text(ATTRIBUTION.format(what=what), encoding="utf-8")
    print(f"wrote {TESTS} and {BENCHMARKS}")


if __name__ == "__main__":
    main()
