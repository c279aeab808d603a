"""Every metadata file of a store, damaged the ways a byte flip or a hand edit damages JSON: each
top-level key renamed, removed, or given a value of another type. A read then gives the store's own
numbers (what zarr does not need) or StoreDamagedError, never another exception; verify never
raises, and reports DAMAGED whenever a read refuses. The two cases a user met by name: the root's
``node_type`` turned ``n5de_type``, and its ``"group"`` turned ``"array"``: DAMAGED and exit 1 from
``layerwise verify`` and ``export``, StoreDamagedError from every read."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import layerwise as lw
from layerwise.errors import StoreDamagedError

TEXTS = ["The bank raised rates.", "We sat on the river bank.", "Rates rose again."]


@pytest.fixture(scope="module")
def written(tiny_encoder, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("intact") / "texts.lw"
    lw.extract_to_store(tiny_encoder, TEXTS, path, lw.OutputPlan.parse(layers="all"))
    return path


def _mutations(document: dict):
    for key in list(document):
        yield f"rename {key}", {(k if k != key else key[:1] + "5" + key[2:]): v for k, v in document.items()}
        yield f"remove {key}", {k: v for k, v in document.items() if k != key}
        value = document[key]
        other = [1] if isinstance(value, str) else 7 if isinstance(value, dict | list) else "x"
        yield f"retype {key}", {**document, key: other}


def _read(path: Path) -> list[np.ndarray]:
    store = lw.open_store(path)
    every = [store[i].hidden for i in range(len(store))]
    assert [s.hidden.shape for s in store] == [h.shape for h in every]  # iteration reads them too
    return every


def test_every_metadata_file_damaged_reads_true_or_refuses(written, tmp_path):
    want = _read(written)
    seen = 0
    for meta in sorted(written.rglob("zarr.json")):
        relative = meta.relative_to(written)
        for label, mutated in _mutations(json.loads(meta.read_text())):
            copy = tmp_path / f"{len(list(tmp_path.iterdir()))}.lw"
            shutil.copytree(written, copy)
            (copy / relative).write_text(json.dumps(mutated))
            try:
                got = _read(copy)
            except StoreDamagedError:
                refused = True
            else:
                refused = False
                assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), (relative, label)
            report = lw.verify_store(copy)
            assert not (refused and report.ok), f"{relative} {label}: a read refuses it, verify says ok"
            shutil.rmtree(copy)
            seen += 1
    assert seen >= 60  # the root's keys and each array's (data, offsets, positions)


@pytest.mark.parametrize(
    "edit", [lambda t: t.replace('"node_type"', '"n5de_type"'), lambda t: t.replace('"group"', '"array"')]
)
def test_a_root_that_is_not_a_group_is_damaged_for_every_reader(written, tmp_path, edit):
    copy = tmp_path / "texts.lw"
    shutil.copytree(written, copy)
    (copy / "zarr.json").write_text(edit((copy / "zarr.json").read_text()))
    for read in (
        lambda: lw.open_store(copy),
        lambda: lw.open_store(copy)[0],
        lambda: list(lw.open_store(copy)),
        lambda: lw.open_store(copy).array(-1),
    ):
        with pytest.raises(StoreDamagedError, match=r"root metadata .*zarr\.json"):
            read()
    assert not lw.verify_store(copy).ok
    cli = [sys.executable, "-m", "layerwise"]
    verify = subprocess.run([*cli, "verify", str(copy)], capture_output=True, text=True, timeout=120)
    assert verify.returncode == 1 and "DAMAGED" in verify.stdout + verify.stderr
    out = tmp_path / "vectors.parquet"
    export = subprocess.run(
        [*cli, "export", str(copy), "-o", str(out), "--pool", "sentence:mean", "--layers", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert export.returncode == 1 and "Traceback" not in export.stderr and not out.exists()


def test_the_sealed_records_refuse_any_key_renamed_or_removed_the_seal_too(written, tiny_encoder, tmp_path):
    """The store's record (zarr.json's ``layerwise`` attribute) and the activation cache's
    (``layerwise-cache.json``) are sealed: each key renamed or removed is damage, the seal's own key
    included (a record of a version that seals must carry one)."""
    document = json.loads((written / "zarr.json").read_text())
    record = document["attributes"]["layerwise"]
    assert "meta_sha256" in record
    for key in record:
        for label, changed in (("renamed", key[:1] + "5" + key[2:]), ("removed", None)):
            copy = tmp_path / f"{key}-{label}.lw"
            shutil.copytree(written, copy)
            edited = {
                (changed if k == key else k): v
                for k, v in record.items()
                if not (k == key and changed is None)
            }
            (copy / "zarr.json").write_text(json.dumps({**document, "attributes": {"layerwise": edited}}))
            with pytest.raises(StoreDamagedError):
                lw.open_store(copy)
            shutil.rmtree(copy)
    cache = tmp_path / "acts"
    lw.cache_activations(tiny_encoder, TEXTS * 4, cache, lw.CacheOptions(layers="1", context=8, tokens=32))
    meta = json.loads((cache / "layerwise-cache.json").read_text())
    for key in ("meta_sha256", "layers", "d_model"):
        copy = tmp_path / f"acts-{key}"
        shutil.copytree(cache, copy)
        (copy / "layerwise-cache.json").write_text(json.dumps({k: v for k, v in meta.items() if k != key}))
        with pytest.raises(StoreDamagedError):
            lw.load_cache(copy)
        assert not lw.verify_cache(copy).ok
