"""The shard table of a sharded store, and the identity each shard records of itself.

    corpus.lw/
      layerwise-shards.json      the table: format, version, run id, model, plan, n_texts, the
                                 texts' hash, and per shard its name, its global range
                                 [start, stop) and the hash of its texts
      shard-00000.lw/            an ordinary store (format.py) holding texts start..stop-1 as ids 0..
      shard-00001.lw/ ...

Nothing read from the table is trusted. :func:`read_table` accepts only a table whose shard ``k`` is
named ``shard-{k:05d}.lw`` and whose ranges run from 0 to ``n_texts`` without gap or overlap;
:func:`shard_path` is the one way from a name to a folder, and refuses anything that is not such a
folder inside the store. Each shard writes its identity (:func:`shard_identity`: its index, range,
run id and texts' hash) into its own metadata, and :func:`shard_problems` compares it, and the
shard's plan, with the table; the reader also requires one model's weights across shards (their
``weights_sha256``). A shard copied, swapped, or written by another run, model, plan or corpus is
named as damage, never read as if it belonged.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from .._features.plan import OutputPlan
from .._settings.settings import Settings, numbers_keys
from ..errors import NotAStoreError, OptionError, StoreDamagedError, StoreError
from ._format import classify, seal_problem, sealed

if TYPE_CHECKING:
    from .._inputs.corpus import Corpus

TABLE = "layerwise-shards.json"
TABLE_FORMAT = "layerwise-sharded-store"
# 2: shards record their identity (index, range, run, texts' hash); version 1 tables had none
TABLE_VERSION = 2
SHARD_NAME = re.compile(r"shard-[0-9]{5,}\.lw")
# What every shard must share with the table (the plan and how long texts were handled): every plan
# entry that changes the numbers (settings.NUMBERS) but the final norm, which tables before layerwise
# 0.3 did not record: it is compared with the settings below.
PLAN_KEYS = tuple(key for key in numbers_keys(OutputPlan) if key != "final_norm")
# What every shard must share with the table where the table records it: the settings that change
# the numbers. The model is compared by name here; the reader also compares the weights' hashes.
RECORDED_KEYS = ("model", *numbers_keys(Settings))


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.lw"


def is_sharded(path: str | os.PathLike) -> bool:
    return (Path(path) / TABLE).is_file()


def texts_sha256(texts: Iterable[str], text_pairs: Iterable[str | None] | None = None) -> str:
    """SHA-256 over the texts (and their second segments), in order: the identity of a corpus."""
    digest = hashlib.sha256()
    pairs = iter(text_pairs) if text_pairs is not None else None
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass") + b"\x00")
        if pairs is not None:
            pair = next(pairs)
            digest.update((pair or "").encode("utf-8", "surrogatepass") + b"\x00")
    return digest.hexdigest()


def shard_ranges(n_texts: int, shard_size: int) -> list[tuple[int, int]]:
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise OptionError(f"shard_size={shard_size!r} must be a whole number >= 1")
    return [(start, min(start + shard_size, n_texts)) for start in range(0, n_texts, shard_size)]


def shard_path(root: Path, name: object) -> Path:
    """The folder of shard ``name`` inside the store at ``root``: a plain ``shard-NNNNN.lw``, no
    ``..``, no absolute path, no symbolic link that leaves the store. Every path that opens,
    verifies, resumes or deletes a shard goes through here."""
    if not isinstance(name, str) or not SHARD_NAME.fullmatch(name):
        raise StoreDamagedError(
            f"{root / TABLE} names a shard {name!r}; a shard is a folder shard-NNNNN.lw inside the store. "
            "The table was edited or damaged: rewrite the store with --overwrite (Python: overwrite=True)"
        )
    path = root / name
    if path.is_symlink():
        target = path.resolve()
        if target.parent != root.resolve():
            raise StoreDamagedError(
                f"shard {name} of {root} is a symbolic link to {str(target)!r}, outside the store; "
                "layerwise reads and deletes only inside the store: remove the link and rerun"
            )
    return path


def read_table(root: Path) -> dict:
    """The table of the sharded store at ``root``, checked: a malformed table, a name that is not
    the k-th shard's, or ranges with a gap, an overlap or a wrong end are a StoreDamagedError."""
    where = root / TABLE
    try:
        table = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreDamagedError(f"{where} cannot be read ({exc}); rerun the command to rewrite it") from None
    if not isinstance(table, dict) or table.get("format") != TABLE_FORMAT:
        raise NotAStoreError(f"{where} is not a layerwise sharded-store table (no format {TABLE_FORMAT!r})")
    if table.get("format_version") != TABLE_VERSION:
        raise StoreDamagedError(
            f"{where} has format_version {table.get('format_version')!r}; this layerwise reads version "
            f"{TABLE_VERSION} (shards that record their identity): rewrite the store with --overwrite"
        )

    def bad(problem: str) -> StoreDamagedError:
        return StoreDamagedError(
            f"{where} is damaged: {problem}. Rewrite the store with --overwrite (Python: overwrite=True)",
            problems=[problem],
        )

    changed = seal_problem(table, "the table")
    if changed:
        raise bad(changed)
    n_texts, shards = table.get("n_texts"), table.get("shards")
    if isinstance(n_texts, bool) or not isinstance(n_texts, int) or n_texts < 0:
        raise bad(f"n_texts is {n_texts!r}, not a count")
    if not isinstance(shards, list):
        raise bad(f"'shards' is {type(shards).__name__}, not a list of shards")
    if not isinstance(table.get("run_id"), str):
        raise bad("the run id is missing")
    expected_start = 0
    for k, shard in enumerate(shards):
        if not isinstance(shard, dict):
            raise bad(f"shard {k} is {shard!r:.60}, not an object")
        name, start, stop = shard.get("name"), shard.get("start"), shard.get("stop")
        if name != shard_name(k):
            raise bad(f"shard {k} is named {name!r}, not {shard_name(k)!r}")
        if (
            not (isinstance(start, int) and isinstance(stop, int))
            or isinstance(start, bool)
            or isinstance(stop, bool)
        ):
            raise bad(f"shard {name} has range {start!r}..{stop!r}, not whole numbers")
        if start != expected_start:
            what = "a gap" if start > expected_start else "an overlap"
            raise bad(f"shard {name} starts at text {start}, not {expected_start}: {what} between shards")
        if stop <= start:
            raise bad(f"shard {name} has an empty or reversed range {start}..{stop}")
        if not isinstance(shard.get("texts_sha256"), str):
            raise bad(f"shard {name} has no texts_sha256")
        expected_start = stop
    if expected_start != n_texts:
        raise bad(f"the shards cover texts 0..{expected_start - 1} but the store holds {n_texts}")
    return table


def new_table(*, model: str, plan_meta: dict, corpus: Corpus, shard_size: int, settings: dict) -> dict:
    """A table for ``corpus`` in shards of ``shard_size``, with a new run id (kept by a resumed run).
    One pass over the corpus hashes each shard's texts (texts_sha256's bytes): memory stays flat."""
    scan = corpus.scan(ranges=shard_size)
    shards = [
        {"name": shard_name(k), "start": start, "stop": stop, "texts_sha256": digest}
        for k, ((start, stop), digest) in enumerate(
            zip(shard_ranges(scan.n_texts, shard_size), scan.range_hashes, strict=True)
        )
    ]
    return {
        "format": TABLE_FORMAT,
        "format_version": TABLE_VERSION,
        "run_id": uuid.uuid4().hex,
        "model": model,
        "n_texts": scan.n_texts,
        "shard_size": shard_size,
        "texts_sha256": scan.sha256,
        **plan_meta,
        **settings,
        "shards": shards,
    }


def write_table(root: Path, table: dict) -> None:
    """Write the table atomically (temp file + rename): a reader sees the old or the new one."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{TABLE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(sealed(table), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, root / TABLE)


def shard_identity(table: dict, index: int) -> dict:
    """What shard ``index`` records of itself in its own metadata."""
    shard = table["shards"][index]
    return {
        "index": index,
        "start": shard["start"],
        "stop": shard["stop"],
        "run_id": table["run_id"],
        "texts_sha256": shard["texts_sha256"],
    }


def shard_problems(table: dict, index: int, meta: dict) -> list[str]:
    """How shard ``index``'s own metadata ``meta`` disagrees with the table (empty: it belongs)."""
    name = shard_name(index)
    identity = meta.get("shard")
    if not isinstance(identity, dict):
        return [
            f"{name} is not a shard of a sharded store (it records no identity): another store was put there"
        ]
    expected = shard_identity(table, index)
    problems = []
    labels = {"index": "is shard", "start": "starts at text", "stop": "stops before text"}
    for key in ("index", "start", "stop"):
        if identity.get(key) != expected[key]:
            problems.append(f"{name} {labels[key]} {identity.get(key)!r}, the table says {expected[key]!r}")
    if identity.get("run_id") != expected["run_id"]:
        theirs, ours = identity.get("run_id"), expected["run_id"]
        problems.append(f"{name} was written by another run ({theirs!r}, the table's is {ours!r})")
    elif identity.get("texts_sha256") != expected["texts_sha256"]:
        problems.append(
            f"{name} holds other texts than the table's range {expected['start']}..{expected['stop'] - 1}"
        )
    if meta.get("n_texts") != expected["stop"] - expected["start"]:
        problems.append(
            f"{name} holds {meta.get('n_texts')!r} texts, its range {expected['stop'] - expected['start']}"
        )
    for key in PLAN_KEYS:
        if meta.get(key) != table.get(key):
            problems.append(f"{name} has {key}={meta.get(key)!r}, the store's is {table.get(key)!r}")
    for key in RECORDED_KEYS:  # tables before layerwise 0.3 did not record these; None: the model's
        if table.get(key) is not None and meta.get(key) != table[key]:
            problems.append(f"{name} has {key}={meta.get(key)!r}, the store's is {table[key]!r}")
    return problems


def remove_own_shards(root: Path) -> None:
    """Delete this store's shards and table, and nothing else: only real folders named
    ``shard-NNNNN.lw`` directly inside ``root`` that are layerwise stores (or the empty folder a
    killed writer left); the table's names are not trusted for this."""
    if not root.is_dir():
        return
    # everything is checked before anything is deleted: a refusal leaves the store as it was
    for entry in sorted(os.listdir(root)):
        path = root / entry
        if SHARD_NAME.fullmatch(entry) and path.is_symlink():
            raise StoreError(
                f"{str(path)!r} is a symbolic link (to {str(path.resolve())!r}), not a shard this store "
                "wrote; layerwise deletes only its own folders: remove the link, then rerun with --overwrite"
            )
    for entry in sorted(os.listdir(root)):
        path = root / entry
        if not SHARD_NAME.fullmatch(entry) or path.is_symlink() or not path.is_dir():
            continue
        if classify(path) in ("store", "empty"):
            try:
                shutil.rmtree(path)
            except OSError as exc:
                raise StoreError(f"cannot remove shard {str(path)!r}: {exc.strerror}") from exc
    (root / TABLE).unlink(missing_ok=True)
