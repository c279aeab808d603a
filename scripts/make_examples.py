"""Write the README tour's example corpora under examples/ (run once; the files are committed):

    examples/corpus.parquet        60 UD English EWT dev sentences: doc_id, text
    examples/data/part-{0,1}.parquet   the same 60 as two files: doc_id, body

The sentences come from tests/data/ud_ewt (UD English EWT, CC BY-SA 4.0: see examples/README.md).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    lines = (ROOT / "tests/data/ud_ewt/en_ewt-ud-dev.sentences.txt").read_text(encoding="utf-8").splitlines()
    sentences = [s for s in lines if s.strip()][:60]
    ids = [f"d{i}" for i in range(len(sentences))]
    pq.write_table(pa.table({"doc_id": ids, "text": sentences}), ROOT / "examples/corpus.parquet")
    (ROOT / "examples/data").mkdir(exist_ok=True)
    table = pa.table({"doc_id": ids, "body": sentences})
    pq.write_table(table.slice(0, 30), ROOT / "examples/data/part-0.parquet")
    pq.write_table(table.slice(30), ROOT / "examples/data/part-1.parquet")


if __name__ == "__main__":
    main()
