"""The store never loses data and never returns another text's numbers: locking, what may be
overwritten, settings checked before anything is created, damage found on open, resume and verify."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_close_fp16, corpus

import layerwise as lw
from layerwise.errors import NotAStoreError, OptionError, StoreDamagedError, StoreError
from layerwise.store._commit import Committer

LAYOUT = lw.StoreLayout(chunk_rows=8, shard_chunks=2, block_size=16)


# ---------------------------------------------------------------------------- one writer
def _paused_writer(monkeypatch, tiny, path: Path, **options):
    """Start a writer in a thread and hold it inside its first commit."""
    entered, release = threading.Event(), threading.Event()
    original = Committer.commit

    def slow(self, job):
        entered.set()
        release.wait(30)
        return original(self, job)

    monkeypatch.setattr(Committer, "commit", slow)
    errors: list[BaseException] = []

    def run():
        try:
            lw.extract_to_store(tiny, corpus(40), path, layout=LAYOUT, **options)
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert entered.wait(30), "the first writer never reached its first commit"
    return thread, release, errors


@pytest.mark.parametrize("overwrite", [False, True])
def test_second_writer_on_a_new_store_is_refused(tmp_path, tiny, monkeypatch, overwrite):
    path = tmp_path / "new.lw"
    thread, release, errors = _paused_writer(monkeypatch, tiny, path)
    try:
        with pytest.raises(StoreError, match=r"is being written by another process \(pid \d+\)"):
            lw.extract_to_store(
                tiny,
                corpus(40),
                path,
                lw.OutputPlan.parse(pool="sentence:mean", dtype="float16"),
                layout=LAYOUT,
                overwrite=overwrite,
            )
    finally:
        release.set()
        thread.join(60)
    assert not errors
    store = lw.open_store(path)
    assert store.complete and store.level == "token" and len(store.manifest) == 40


def test_lock_file_that_is_a_symlink_is_not_followed(tmp_path, tiny):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    path = tmp_path / "c.lw"
    path.mkdir()
    (path / ".lock").symlink_to(target)
    with pytest.raises(StoreError, match="is a symbolic link"):
        lw.extract_to_store(tiny, corpus(3), path)
    assert target.read_text() == "keep me"


def test_lock_survives_overwrite(tmp_path, tiny):
    path = tmp_path / "c.lw"
    lw.extract_to_store(tiny, corpus(5), path)
    inode = (path / ".lock").stat().st_ino
    lw.extract_to_store(tiny, corpus(5), path, overwrite=True)
    assert (path / ".lock").stat().st_ino == inode


# ---------------------------------------------------------------------------- what may be overwritten
def test_folder_with_a_lock_file_and_user_files_is_not_touched(tmp_path, tiny):
    folder = tmp_path / "mine"
    (folder / "sub").mkdir(parents=True)
    (folder / ".lock").write_text("")
    (folder / "notes.txt").write_text("important")
    (folder / "sub" / "data.csv").write_text("1,2")
    for overwrite in (False, True):
        with pytest.raises(NotAStoreError, match="is a folder that is not a layerwise store"):
            lw.extract_to_store(tiny, corpus(3), folder, overwrite=overwrite)
    assert (folder / "notes.txt").read_text() == "important" and (folder / "sub" / "data.csv").exists()


def test_zarr_group_that_is_not_a_store_is_not_overwritten(tmp_path, tiny):
    import zarr

    folder = tmp_path / "other.zarr"
    group = zarr.create_group(str(folder), zarr_format=3)
    group.create_array("x", shape=(3,), dtype="int32")[:] = np.arange(3)
    with pytest.raises(NotAStoreError):
        lw.extract_to_store(tiny, corpus(3), folder, overwrite=True)
    np.testing.assert_array_equal(zarr.open_group(str(folder), mode="r")["x"][:], np.arange(3))


def test_overwrite_removes_only_the_stores_own_entries(tmp_path, tiny):
    path = tmp_path / "c.lw"
    lw.extract_to_store(tiny, corpus(5), path)
    (path / "README.txt").write_text("my notes about this store")
    (path / "extra").mkdir()
    lw.extract_to_store(tiny, corpus(7, seed=9), path, overwrite=True)
    assert (path / "README.txt").read_text() == "my notes about this store" and (path / "extra").is_dir()
    assert len(lw.open_store(path)) == 7
    with pytest.raises(NotAStoreError):
        lw.open_store(tmp_path / "nothing-here.lw")


# ---------------------------------------------------------------------------- settings checked first
def test_bad_settings_create_nothing(tmp_path, make_tiny_model):
    enc = lw.Encoder(make_tiny_model("bert"), device="cpu", max_length=16)
    path = tmp_path / "c.lw"
    with pytest.raises(OptionError, match="stride=10000 must be between 1 and 14"):
        lw.extract_to_store(
            enc, ["a b c"], path, lw.OutputPlan.parse(dtype="float16", long_texts="window", stride=10000)
        )
    with pytest.raises(OptionError, match="long_texts='bogus' is not valid"):
        lw.extract_to_store(enc, ["a"], path, lw.OutputPlan.parse(dtype="float16", long_texts="bogus"))
    with pytest.raises(OptionError, match="stride=4 applies to sliding windows only"):
        lw.extract_to_store(enc, ["a"], path, lw.OutputPlan.parse(dtype="float16", stride=4))
    with pytest.raises(lw.InputError, match=r"texts\[1\] is int"):
        lw.extract_to_store(enc, ["a", 3], path)  # type: ignore[list-item]
    assert not path.exists()
    summary = lw.extract_to_store(
        enc, ["a " * 30], path, lw.OutputPlan.parse(dtype="float16", long_texts="window", stride=4)
    )
    assert summary.n_written == 1 and lw.open_store(path)[0].n_windows > 1


def test_new_settings_replace_old_ones_while_nothing_is_committed(tmp_path, make_tiny_model):
    enc = lw.Encoder(make_tiny_model("bert"), device="cpu", max_length=16)
    path = tmp_path / "c.lw"
    # the first segment leaves no room for windows: this fails after the store was created, and
    # the refused run removes what it made (nothing was committed)
    firsts, seconds = ["x " * 20, "q"], ["a " * 30, "b"]
    with pytest.raises(lw.InputError, match="first segment of this pair"):
        lw.extract_to_store(
            enc,
            lw.Corpus.from_inputs(firsts, text_pairs=seconds),
            path,
            lw.OutputPlan.parse(dtype="float16", long_texts="window"),
        )
    assert not path.exists()
    summary = lw.extract_to_store(
        enc, lw.Corpus.from_inputs(firsts, text_pairs=seconds), path
    )  # truncate instead
    assert summary.n_written == 2 and lw.open_store(path).meta["long_texts"] == "truncate"


@pytest.mark.parametrize("missing", [["manifest"], ["positions", "manifest"]])
def test_a_writer_killed_while_creating_the_store_is_resumed(tmp_path, tiny, missing):
    """_create makes the group (with the metadata), data, offsets, positions, then the manifest
    folder: a kill between two steps leaves a prefix of them and nothing committed, and the same
    call then writes the whole store (it once resumed into the missing manifest folder: ENOENT)."""
    import zarr

    texts = corpus(12, seed=2)
    path, fresh = tmp_path / "c.lw", tmp_path / "fresh.lw"
    lw.extract_to_store(tiny, texts, fresh, layout=LAYOUT)
    shutil.copytree(fresh, path)
    group = zarr.open_group(str(path), mode="r+")
    group["offsets"][1:] = np.full(group["offsets"].shape[0] - 1, -1)  # nothing committed
    for name in missing:
        shutil.rmtree(path / name)
    summary = lw.extract_to_store(tiny, texts, path, layout=LAYOUT)
    assert summary.n_written == 12 and lw.open_store(path).verify().ok
    for i in range(12):
        np.testing.assert_array_equal(lw.open_store(path)[i].hidden, lw.open_store(fresh)[i].hidden)


# ---------------------------------------------------------------------------- damage
@pytest.fixture(scope="module")
def good_store(tmp_path_factory, tiny):
    path = tmp_path_factory.mktemp("good") / "c.lw"
    lw.extract_to_store(tiny, corpus(80, seed=5), path, layout=LAYOUT)
    return path


def _copy(good: Path, tmp_path: Path) -> Path:
    target = tmp_path / "damaged.lw"
    shutil.copytree(good, target)
    return target


def _parts(path: Path) -> list[Path]:
    return sorted((path / "manifest").glob("part-*.parquet"))


def _shard(path: Path, k: int) -> Path:
    return path / "data" / "c" / str(k) / "0" / "0"


def _delete_part(path):
    _parts(path)[1].unlink()


def _duplicate_part(path):
    part = _parts(path)[1]
    shutil.copy(part, part.with_name(part.stem + "-copy.parquet"))


def _delete_shard(path):
    _shard(path, 2).unlink()


def _change_offset(path):
    import zarr

    offsets = zarr.open_group(str(path), mode="r+")["offsets"]
    offsets[5] = offsets[5] + 3


def _shrink_data(path):
    meta_path = path / "data" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["shape"][0] = 20
    meta_path.write_text(json.dumps(meta))


# (damage, what verify and a resuming writer say, what reading says). Opening reads nothing per
# text: damage it can see (the layout) fails the open, the rest fails the read of a text it touches.
DAMAGE = {
    "deleted manifest part": (_delete_part, "positions missing", "manifest row of position .* is missing"),
    "duplicated manifest part": (_duplicate_part, "duplicated", "duplicated"),
    "deleted data shard": (_delete_shard, *[r"data shard data/c/2/0/0 \(rows 32\.\.47\) is missing"] * 2),
    "changed offsets entry": (_change_offset, "disagree with offsets", "disagrees with offsets"),
    "shrunk data shape": (_shrink_data, *["the data array holds 20 rows"] * 2),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damage_is_detected_on_read_resume_and_verify(tmp_path, tiny, good_store, kind):
    damage, message, on_read = DAMAGE[kind]
    path = _copy(good_store, tmp_path)
    damage(path)
    with pytest.raises(StoreDamagedError, match=on_read):
        list(lw.open_store(path))  # the open, or the read of a text the damage touches
    with pytest.raises(StoreDamagedError, match=message):
        lw.extract_to_store(
            tiny, corpus(80, seed=5), path, layout=LAYOUT
        )  # resume never says "nothing to do"
    report = lw.verify_store(path)
    assert not report.ok and any(__import__("re").search(message, p) for p in report.problems)


def test_changed_bytes_are_found_by_checksum_and_named(tmp_path, good_store):
    path = _copy(good_store, tmp_path)
    store = lw.open_store(path)
    assert store.verify().ok
    start, _ = store.rows(17)
    import zarr

    data = zarr.open_group(str(path), mode="r+")["data"]
    data[start] = data[start] + 1
    store = lw.open_store(path)  # the structure is intact: only checksums can tell
    with pytest.raises(StoreDamagedError, match="rows of text 17 differ from the checksum"):
        store[17]
    assert store[16].text is not None  # the others read as before
    report = store.verify()
    assert not report.ok and report.text_ids == [17]
    assert "texts affected (1): 17" in str(report)


def test_truncated_shard_is_reported_not_raised(tmp_path, good_store):
    path = _copy(good_store, tmp_path)
    shard = _shard(path, 1)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    store = lw.open_store(path)  # the file exists: only reading it shows the damage
    victims = [i for i in store.text_ids() if store.rows(i)[0] < 32 and store.rows(i)[1] > 16]
    with pytest.raises(StoreDamagedError, match="cannot be read"):
        store[victims[0]]
    report = store.verify()
    assert not report.ok and "cannot be read" in report.problems[0] and set(victims) <= set(report.text_ids)


def test_lookup_is_by_position_and_values_are_right(good_store, tiny):
    store = lw.open_store(good_store)
    exact = tiny.extract(corpus(80, seed=5))
    for i in (0, 17, 79):
        assert_close_fp16(store[i].hidden, exact[i].hidden)
    with pytest.raises(TypeError, match="a text id is an int"):
        store[5.7]  # type: ignore[index]
    with pytest.raises(TypeError):
        store[True]


def test_temporary_manifest_part_does_not_break_plain_pyarrow(tmp_path, good_store):
    import pyarrow.parquet as pq

    path = _copy(good_store, tmp_path)
    part = _parts(path)[0]
    shutil.copy(part, part.with_name(f".{part.name}.partial"))
    (path / "manifest" / ".part-x.partial").write_bytes(b"half written")
    assert pq.read_table(path / "manifest").num_rows == 80
    assert len(lw.open_store(path)) == 80


def test_cli_verify(tmp_path, good_store):
    from typer.testing import CliRunner

    from layerwise.cli import app

    ok = CliRunner().invoke(app, ["verify", str(good_store)])
    assert ok.exit_code == 0 and "OK: 80 texts" in ok.output
    path = _copy(good_store, tmp_path)
    _delete_shard(path)
    bad = CliRunner().invoke(app, ["verify", str(path)])
    assert bad.exit_code == 1 and "DAMAGED" in bad.output and "texts affected" in bad.output


def test_rerun_removes_zarr_temp_files_a_kill_left(tmp_path, tiny):
    # zarr writes "<key>.<uuid>.partial" then renames it: a SIGKILL in between leaves the temp file
    texts = [f"text {i} about the river bank" for i in range(6)]
    path = tmp_path / "s.lw"
    lw.extract_to_store(tiny, texts, path)
    before = lw.open_store(path)[3].hidden
    planted = [
        path / "offsets" / "c" / "0.1cce03f491724fdfb9e79aa9ec9a4d37.partial",
        path / "data" / "c" / "0" / "0" / "0.0123456789abcdef0123456789abcdef.partial",
        path / "positions" / "c" / "0.80e0d6957d764d92b7081b9203bfd107.partial",
    ]
    for leftover in planted:
        assert leftover.parent.parent.is_dir()  # the store's own arrays: data, offsets, positions
        leftover.parent.mkdir(parents=True, exist_ok=True)
        leftover.write_bytes(b"half a chunk")
    summary = lw.extract_to_store(tiny, texts, path)
    assert summary.n_written == 0 and not list(path.rglob("*.partial"))
    np.testing.assert_array_equal(lw.open_store(path)[3].hidden, before)


def _set_offsets(path, index, value):
    import zarr

    zarr.open_group(str(path), mode="r+")["offsets"][index] = value


def _flip_offsets_byte(path):
    chunk = path / "offsets" / "c" / "0"
    data = bytearray(chunk.read_bytes())
    data[min(85, len(data) - 1)] = 0xFF
    chunk.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        lambda path, n: _set_offsets(path, n, int(lw.open_store(path).n_rows) - 30),  # last entry shorter
        lambda path, n: _set_offsets(path, n - 1, -1),  # a hole: the entry before the last unwritten
        lambda path, n: _flip_offsets_byte(path),
    ],
    ids=["last-entry-short", "hole", "flipped-byte"],
)
def test_a_damaged_commit_marker_fails_bulk_reads_and_verify_never_fewer_rows(tmp_path, good_store, damage):
    """A commit marker cut short used to make array(-1)[:] and iter_chunks return fewer rows with
    complete=True, and a hole made verify say OK about a store missing texts."""
    path = _copy(good_store, tmp_path)
    n = len(lw.open_store(path))
    damage(path, n)
    with pytest.raises(StoreDamagedError, match=r"commit marker|offsets"):
        store = lw.open_store(path)
        store.array(-1)[:]
    with pytest.raises(StoreDamagedError, match=r"commit marker|offsets"):
        sum(len(rows) for rows in lw.open_store(path).array(-1).iter_chunks(7))
    report = lw.verify_store(path)
    assert not report.ok and not report.incomplete and "DAMAGED" in str(report)


def test_verify_reports_a_store_missing_texts_as_incomplete_exit_1(tmp_path, good_store):
    from typer.testing import CliRunner

    from layerwise.cli import app

    path = _copy(good_store, tmp_path)
    n = len(lw.open_store(path))
    import zarr

    zarr.open_group(str(path), mode="r+")["offsets"][n - 1 :] = -1  # as a write stopped before them
    report = lw.verify_store(path)
    assert report.incomplete and not report.ok and not report.problems
    assert f"INCOMPLETE: {n - 2} of the {n} texts" in str(report)
    result = CliRunner().invoke(app, ["verify", str(path)])
    assert result.exit_code == 1 and "INCOMPLETE" in result.output and "resumes" in result.output
