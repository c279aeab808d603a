"""A sharded store trusts nothing in its table: names resolve inside the store, ranges are checked,
every shard's identity, plan and model are compared with the table, and overwrite deletes only what
it identified as the store's own. Each reproducer of a hostile table or shard is a case here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import layerwise as lw
from layerwise.cli import app
from layerwise.errors import OptionError, StoreDamagedError
from layerwise.store._format import sealed
from layerwise.store._shard_table import TABLE, shard_ranges
from layerwise.store._shard_writer import begin_sharded_store, write_shard
from layerwise.store._sharded import ShardedStore, shard_progress

TEXTS = [f"text number {i} about a bank" + " and a river" * (i % 5) for i in range(25)]
PLAN = lw.OutputPlan.parse(layers="0,-1", dtype="float16")


def write_sharded(encoder, path: Path, texts=TEXTS, plan=PLAN, shard_size=10, overwrite=False) -> dict:
    """A sharded store written without Ray: the same table and shard writer lw.ray uses."""
    table = begin_sharded_store(
        path, model=encoder.name, plan=plan, n_hidden_states=encoder.n_hidden_states, texts=texts,
        text_pairs=None, shard_size=shard_size, overwrite=overwrite,
    )  # fmt: skip
    for k, shard in enumerate(table["shards"]):
        write_shard(encoder, path, table, k, texts[shard["start"] : shard["stop"]], None, plan)  # fmt: skip
    return table


def edit_table(path: Path, change, *, reseal: bool = True) -> None:
    """Change the table as a hostile hand would, recomputing its seal (the checks behind the seal
    must hold on their own), or not (the seal alone catches it)."""
    table = json.loads((path / TABLE).read_text())
    change(table)
    (path / TABLE).write_text(json.dumps(sealed(table) if reseal else table))


def problems_of(path: Path) -> str:
    """verify's report (must be damaged), and the same store refusing to open for reading."""
    report = lw.verify_store(path)
    assert not report.ok, str(report)
    with pytest.raises(StoreDamagedError):
        lw.open_store(path)
    with pytest.raises(StoreDamagedError):  # the writer's light check (no manifest) refuses it too
        shard_progress(path)
    return str(report)


@pytest.fixture
def store(tmp_path, tiny_encoder) -> Path:
    path = tmp_path / "s.lw"
    write_sharded(tiny_encoder, path)
    return path


def test_a_sharded_store_written_without_ray_reads_and_verifies(store, tiny_encoder):
    opened = lw.open_store(str(store))  # a str is a path too
    assert isinstance(opened, ShardedStore) and opened.n_shards == 3 and len(opened) == 25
    assert lw.verify_store(str(store)).ok
    stack = opened[12]  # shard 1, local id 2
    assert stack.text == TEXTS[12]
    exact = tiny_encoder.extract([TEXTS[12]], layers="0,-1")[0]
    np.testing.assert_allclose(stack.hidden, exact.hidden, atol=2e-3)


def test_progress_without_manifests_agrees_with_the_opened_store(tmp_path, tiny_encoder):
    path = tmp_path / "p.lw"
    table = begin_sharded_store(
        path, model=tiny_encoder.name, plan=PLAN, n_hidden_states=tiny_encoder.n_hidden_states, texts=TEXTS,
        text_pairs=None, shard_size=10, overwrite=False,
    )  # fmt: skip
    fresh = shard_progress(path)
    assert (fresh.pending, fresh.n_texts, fresh.n_rows) == ([0, 1, 2], 0, 0)
    for k in (0, 2):
        shard = table["shards"][k]
        write_shard(tiny_encoder, path, table, k, TEXTS[shard["start"] : shard["stop"]], None, PLAN)
    progress, opened = shard_progress(path), ShardedStore(path)
    assert progress.pending == opened.pending_shards() == [1]
    assert progress.n_texts == len(opened) == 15
    assert progress.n_rows == opened.n_rows > 15  # token level: a row per token


def test_a_crafted_name_never_deletes_or_reads_outside_the_store(tmp_path, store, tiny_encoder):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    edit_table(store, lambda t: t["shards"][1].update(name="../victim"))
    with pytest.raises(StoreDamagedError) as caught:
        lw.open_store(store)
    message = str(caught.value)
    assert "'../victim'" in message and "shard-00001.lw" in message
    result = CliRunner().invoke(app, ["verify", str(store)])
    assert result.exit_code == 1 and "../victim" in result.output
    # a rerun with overwrite deletes only the store's own shards, found by looking, not by the table
    write_sharded(tiny_encoder, store, overwrite=True)
    assert (victim / "precious.txt").read_text() == "keep me"
    assert lw.verify_store(store).ok


@pytest.mark.parametrize("name", ["/etc", "shard-00001.lw/../../x", "shard-1.lw", 7, None])
def test_names_that_are_not_the_kth_shard_are_refused(store, name):
    edit_table(store, lambda t: t["shards"][1].update(name=name))
    with pytest.raises(StoreDamagedError, match="shard 1 is named"):
        lw.open_store(store)


def test_a_shard_linked_outside_the_store_is_refused(tmp_path, store):
    outside = tmp_path / "elsewhere.lw"
    shutil.move(store / "shard-00002.lw", outside)
    (store / "shard-00002.lw").symlink_to(outside)
    with pytest.raises(StoreDamagedError, match="symbolic link"):
        lw.open_store(store)
    # overwrite refuses before deleting anything (#46, 6): the link's target, the other shards and
    # the table stay as they were
    before = sorted(p.name for p in store.iterdir())
    table = (store / TABLE).read_text()
    with pytest.raises(lw.StoreError, match="symbolic link"):
        write_sharded(lw.Encoder(lw.read_meta(store / "shard-00000.lw")["model_source"], device="cpu"), store,
                      overwrite=True)  # fmt: skip
    assert sorted(p.name for p in store.iterdir()) == before and (store / TABLE).read_text() == table
    assert (outside / "zarr.json").is_file() and (store / "shard-00000.lw" / "zarr.json").is_file()


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        ("shard-00000.lw", "shard-00001.lw", "shard-00001.lw is shard 0, the table says 1"),
        (
            "shard-00000.lw",
            "shard-00002.lw",
            "shard-00002.lw is shard 0, the table says 2",
        ),  # the shorter last
    ],
)
def test_a_copied_shard_is_damage(store, source, target, expected):
    shutil.rmtree(store / target)
    shutil.copytree(store / source, store / target)
    assert expected in problems_of(store)


def test_swapped_shards_are_damage(store):
    (store / "shard-00000.lw").rename(store / "tmp.lw")
    (store / "shard-00001.lw").rename(store / "shard-00000.lw")
    (store / "tmp.lw").rename(store / "shard-00001.lw")
    report = problems_of(store)
    assert "shard-00000.lw is shard 1" in report and "shard-00001.lw is shard 0" in report


def test_a_shard_of_another_run_or_corpus_is_damage(tmp_path, store, tiny_encoder):
    other_texts = [t.upper() for t in TEXTS]
    write_sharded(tiny_encoder, tmp_path / "other.lw", texts=other_texts)
    shutil.rmtree(store / "shard-00001.lw")
    shutil.copytree(tmp_path / "other.lw" / "shard-00001.lw", store / "shard-00001.lw")
    assert "shard-00001.lw was written by another run" in problems_of(store)


def test_a_forged_identity_is_caught_by_verify_from_the_texts(tmp_path, store, tiny_encoder):
    other = tmp_path / "other.lw"
    write_sharded(tiny_encoder, other, texts=[t.upper() for t in TEXTS])
    shutil.rmtree(store / "shard-00001.lw")
    shutil.copytree(other / "shard-00001.lw", store / "shard-00001.lw")
    # forge the copied shard's identity to the store's own (run id and texts' hash)
    mine = json.loads((store / TABLE).read_text())
    document = json.loads((store / "shard-00001.lw" / "zarr.json").read_text())
    document["attributes"]["layerwise"]["shard"].update(
        run_id=mine["run_id"], texts_sha256=mine["shards"][1]["texts_sha256"]
    )
    document["attributes"]["layerwise"] = sealed(document["attributes"]["layerwise"])  # a careful forger
    (store / "shard-00001.lw" / "zarr.json").write_text(json.dumps(document))
    report = lw.verify_store(store)
    assert not report.ok and "shard-00001.lw holds other texts than the table says" in str(report)
    assert report.text_ids == list(range(10, 20))


def test_a_shard_written_by_another_model_is_damage(tmp_path, store, make_tiny_model):
    other = lw.Encoder(make_tiny_model("bert", 2), device="cpu")  # same width, other weights and depth
    table = json.loads((store / TABLE).read_text())
    shutil.rmtree(store / "shard-00001.lw")
    plan = lw.OutputPlan.parse(layers="0,1", dtype="float16")  # hidden states 0 and 1 exist in both
    table_same_layers = {**table, "layers": [0, 1]}
    write_shard(other, store, table_same_layers, 1, TEXTS[10:20], None, plan)
    report = problems_of(store)
    assert "shard-00001.lw has layers=[0, 1], the store's is [0, 3]" in report


def test_the_reader_requires_one_models_weights(tmp_path, tiny_encoder, make_tiny_model):
    path = tmp_path / "s.lw"
    plan = lw.OutputPlan.parse(layers="0,1", dtype="float16")
    table = write_sharded(tiny_encoder, path, plan=plan)
    other = lw.Encoder(make_tiny_model("bert", 2), device="cpu")
    shutil.rmtree(path / "shard-00001.lw")
    write_shard(other, path, table, 1, TEXTS[10:20], None, plan)
    with pytest.raises(StoreDamagedError, match=r"shard-00001\.lw has model="):  # by name first
        lw.open_store(path)
    # the same name (a folder whose weights changed): the weights' hashes tell them apart
    meta_file = path / "shard-00001.lw" / "zarr.json"
    document = json.loads(meta_file.read_text())
    document["attributes"]["layerwise"]["model"] = table["model"]
    document["attributes"]["layerwise"] = sealed(document["attributes"]["layerwise"])
    meta_file.write_text(json.dumps(document))
    with pytest.raises(StoreDamagedError, match="other weights"):
        lw.open_store(path)
    assert "different models" in str(lw.verify_store(path))


def test_the_tables_model_is_checked_against_the_shards(tmp_path, tiny_encoder):
    """#46, 5: an edited "model" in layerwise-shards.json is damage, not the store's model."""
    path = tmp_path / "s.lw"
    write_sharded(tiny_encoder, path)
    edit_table(path, lambda table: table.update(model="bert-base-uncased"))
    report = lw.verify_store(path)
    assert not report.ok and "shard-00000.lw has model=" in str(report)
    with pytest.raises(StoreDamagedError, match="the store's is 'bert-base-uncased'"):
        lw.open_store(path)


@pytest.mark.parametrize(
    ("pool", "dtype", "layers", "differs"),
    [
        ("word:max", "float16", "0,-1", "level="),
        ("token", "float32", "0,-1", "dtype="),
        ("token", "float16", "0", "layers="),
    ],
)
def test_a_shard_with_another_plan_is_damage(store, tiny_encoder, pool, dtype, layers, differs):
    table = json.loads((store / TABLE).read_text())
    shutil.rmtree(store / "shard-00001.lw")
    plan = lw.OutputPlan.parse(layers=layers, pool=pool, dtype=dtype)
    write_shard(tiny_encoder, store, table, 1, TEXTS[10:20], None, plan)
    assert f"shard-00001.lw has {differs}" in problems_of(store)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda t: t["shards"][1].update(start=9), "starts at text 9, not 10: an overlap"),
        (lambda t: t["shards"][1].update(start=11), "starts at text 11, not 10: a gap"),
        (lambda t: t["shards"].reverse(), "shard 0 is named 'shard-00002.lw'"),
        (lambda t: t["shards"][2].update(stop=30), "cover texts 0..29 but the store holds 25"),
        (lambda t: t.update(n_texts=30), "cover texts 0..24 but the store holds 30"),
        (lambda t: t.pop("shards"), "'shards' is NoneType, not a list"),
        (lambda t: t["shards"][0].update(stop="10"), "not whole numbers"),
        (lambda t: t["shards"].__setitem__(0, []), "shard 0 is [], not an object"),
    ],
)
def test_a_damaged_table_is_a_clear_error(store, change, expected):
    edit_table(store, change)
    with pytest.raises(StoreDamagedError, match="damaged") as caught:
        lw.open_store(store)
    assert expected in str(caught.value)
    result = CliRunner().invoke(app, ["verify", str(store)])
    assert result.exit_code == 1 and expected in " ".join(result.output.split())


def test_a_table_that_is_not_an_object_is_a_clear_error(store):
    (store / TABLE).write_text("[1, 2]")
    with pytest.raises(lw.errors.NotAStoreError, match="not a layerwise sharded-store table"):
        lw.open_store(store)


def test_a_shard_range_that_disagrees_with_the_shard_is_damage(store):
    # the table and its shard agree on names, but the table's ranges moved: every shard says so
    edit_table(store, lambda t: [t["shards"][0].update(stop=12), t["shards"][1].update(start=12)])
    report = problems_of(store)
    assert "shard-00000.lw stops before text 10, the table says 12" in report


def test_resuming_keeps_the_run_and_refuses_other_settings(store, tiny_encoder):
    run_id = json.loads((store / TABLE).read_text())["run_id"]
    shutil.rmtree(store / "shard-00002.lw")  # the last shard still to write
    write_sharded(tiny_encoder, store)
    assert json.loads((store / TABLE).read_text())["run_id"] == run_id and lw.verify_store(store).ok
    with pytest.raises(OptionError, match="other settings or texts"):
        write_sharded(tiny_encoder, store, texts=[*TEXTS[:-1], "changed"])


def test_write_shard_refuses_texts_that_are_not_the_shards(store, tiny_encoder):
    table = json.loads((store / TABLE).read_text())
    with pytest.raises(OptionError, match="not the texts of shard 1"):
        write_shard(tiny_encoder, store, table, 1, TEXTS[11:21], None, PLAN)


def test_overwrite_leaves_other_entries_alone(tmp_path, store, tiny_encoder):
    (store / "notes.txt").write_text("mine")
    (store / "shard-00099.lw").mkdir()
    (store / "shard-00099.lw" / "data.csv").write_text("not a store")
    write_sharded(tiny_encoder, store, overwrite=True)
    assert (store / "notes.txt").read_text() == "mine"
    assert (store / "shard-00099.lw" / "data.csv").is_file()


def test_shard_ranges_refuse_a_bad_size():
    with pytest.raises(OptionError, match="shard_size=0"):
        shard_ranges(10, 0)


def test_a_sharded_store_slices_and_reads_ids_across_shards(store):
    opened = lw.open_store(store)
    across = opened[8:13]  # shards 0 and 1
    assert [s.text for s in across] == TEXTS[8:13]
    assert [s.text for s in opened[::10]] == [TEXTS[0], TEXTS[10], TEXTS[20]]
    assert list(opened.ids) == list(range(25)) and opened.ids[-1] == 24 and opened.ids[9:11] == [9, 10]
    rows = opened.manifest_rows([21, 3], ["text_id", "text"])
    assert rows["text_id"].to_pylist() == [21, 3] and rows["text"].to_pylist() == [TEXTS[21], TEXTS[3]]
    assert list(opened.committed_in(8, 12)) == [8, 9, 10, 11]
