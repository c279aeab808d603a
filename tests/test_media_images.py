"""Image models: every media family equals transformers' own ``output_hidden_states`` of each image
alone (its processor, its model), through the same calls as a text model; units carry their kind
and place; the options an image cannot honour are refused by name."""

from __future__ import annotations

import io

import numpy as np
import pytest
from media_models import (
    MEDIA_TYPES,
    probe_files,
    reference_states,
    save_clip,
    save_image_model,
    save_images,
)

import layerwise as lw

TOL = 1e-5


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return save_images(tmp_path_factory.mktemp("images"), n=3)


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    return save_image_model("vit", tmp_path_factory.mktemp("vit") / "vit")


@pytest.fixture(scope="module")
def vit_encoder(vit):
    return lw.Encoder(vit)


@pytest.mark.parametrize("model_type", MEDIA_TYPES)
def test_every_image_family_equals_transformers(model_type, images, tmp_path):
    folder = save_image_model(model_type, tmp_path / model_type)
    enc = lw.Encoder(folder)
    assert enc.modality == "image" and enc.run_path == "general"
    stacks = enc.extract(images, batch_size=2)  # a batch of two, then one: padding-free batches
    for stack, want in zip(stacks, reference_states(folder, images), strict=True):
        assert stack.hidden.shape == want.shape
        np.testing.assert_allclose(stack.hidden, want, atol=TOL, rtol=0)
        units = stack.units
        n_patches = units.grid_shape[0] * units.grid_shape[1]
        assert units.grid_shape == (4, 4) and list(units.kinds).count("patch") == n_patches
        prefix = len(units.kinds) - n_patches
        assert units.kinds[:prefix] == enc.family.prefix_of(enc.config)
        # patches row by row after the prefix; the prefix has no place on the grid
        assert units.grid[prefix:].tolist() == [[r, c] for r in range(4) for c in range(4)]
        assert (units.grid[:prefix] == -1).all()


def test_units_are_named_and_counted_as_words(vit_encoder, images):
    stack = vit_encoder.extract(images[0])
    assert stack.tokens[:3] == ("[CLS]", "r0c0", "r0c1") and stack.tokens[-1] == "r3c3"
    assert stack.word_ids.tolist() == [-1, *range(16)]
    assert stack.text == images[0] and stack.units.source == images[0] and stack.modality == "image"
    assert stack.units.of("patch").tolist() == list(range(1, 17))
    assert not stack.empty


def test_a_two_tower_clip_runs_its_vision_tower(images, tmp_path):
    from transformers import CLIPVisionModel

    folder = save_clip(tmp_path / "clip")
    enc = lw.Encoder(folder)
    assert enc.model_type == "clip_vision_model"
    want = reference_states(folder, images, CLIPVisionModel)
    for stack, expected in zip(enc.extract(images), want, strict=True):
        np.testing.assert_allclose(stack.hidden, expected, atol=TOL, rtol=0)


def test_images_in_memory_equal_their_files(vit_encoder, images):
    from PIL import Image

    by_path = vit_encoder.extract(images[1]).hidden
    with Image.open(images[1]) as opened:
        pil = opened.convert("RGB")
        pixels = np.asarray(pil)
    with open(images[1], "rb") as handle:
        encoded = handle.read()
    for item in (pil, pixels, pixels / 255.0, encoded, io.BytesIO(encoded).getvalue()):
        np.testing.assert_allclose(vit_encoder.extract(item).hidden, by_path, atol=TOL, rtol=0)
    assert vit_encoder.extract(pil).text == "<image 0>"


def test_a_jpeg_and_a_webp_are_decoded(vit_encoder, images, tmp_path):
    from PIL import Image

    with Image.open(images[0]) as opened:
        rgb = opened.convert("RGB")
    for suffix in (".jpg", ".webp"):
        path = tmp_path / f"photo{suffix}"
        rgb.save(path)
        with Image.open(path) as decoded:
            want = vit_encoder.extract(decoded.convert("RGB")).hidden
        np.testing.assert_allclose(vit_encoder.extract(str(path)).hidden, want, atol=TOL, rtol=0)


def test_sentence_pools_of_an_image(vit_encoder, images):
    stacks = vit_encoder.extract(images)
    cls = vit_encoder.embed(images, pool="cls")
    every = vit_encoder.embed(images, pool="mean")
    patches = vit_encoder.embed(images, pool="mean", special_tokens="exclude")
    last = vit_encoder.embed(images, layers=-1, pool="mean", special_tokens="exclude")
    for k, stack in enumerate(stacks):
        np.testing.assert_allclose(cls[k], stack.hidden[:, 0], atol=TOL)
        np.testing.assert_allclose(every[k], stack.hidden.mean(axis=1), atol=TOL)
        np.testing.assert_allclose(patches[k], stack.hidden[:, 1:].mean(axis=1), atol=TOL)
        np.testing.assert_allclose(last[k], stack.hidden[-1, 1:].mean(axis=0), atol=TOL)
    one = vit_encoder.embed(images[0], layers=-1, pool="cls")
    np.testing.assert_allclose(one, stacks[0].hidden[-1, 0], atol=TOL)


def test_layers_and_float16(vit_encoder, images):
    full = vit_encoder.extract(images[0]).hidden
    part = vit_encoder.extract(images[0], layers=[0, -1], dtype="float16")
    assert part.layers == (0, 2) and part.hidden.dtype == np.float16
    np.testing.assert_allclose(part.hidden.astype(np.float32), full[[0, 2]], atol=2e-2)
    with pytest.raises(lw.LayerSpecError, match="out of range"):
        vit_encoder.extract(images[0], layers=5)


def test_what_an_image_cannot_do_is_refused_by_name(vit_encoder, images, tmp_path):
    with pytest.raises(lw.OptionError, match="an image has no words"):
        vit_encoder.embed_words([images[0]])
    with pytest.raises(lw.OptionError, match="pool='last'"):
        vit_encoder.embed(images, pool="last")
    with pytest.raises(lw.InputError, match="text_pairs: text options"):
        vit_encoder.embed(images, text_pairs=images)
    with pytest.raises(lw.OptionError, match="no tokenizer"):
        vit_encoder.tokenize(images)
    with pytest.raises(lw.InputError, match="does not exist"):
        vit_encoder.extract(str(tmp_path / "missing.png"))
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    with pytest.raises(lw.InputError, match="cannot be decoded"):
        vit_encoder.extract(str(broken))
    with pytest.raises(lw.InputError, match="float pixels must lie in"):
        vit_encoder.extract(np.full((8, 8, 3), 2.0))


def test_a_model_without_cls_refuses_the_cls_pool(images, tmp_path):
    enc = lw.Encoder(save_image_model("siglip_vision_model", tmp_path / "siglip"))
    with pytest.raises(lw.OptionError, match="no \\[CLS\\] unit"):
        enc.embed(images, pool="cls")
    assert enc.embed(images, pool="mean").shape == (3, 3, 32)


def test_text_only_settings_are_refused(vit):
    with pytest.raises(lw.OptionError, match="streaming=True"):
        lw.Encoder(vit, streaming=True)
    with pytest.raises(lw.OptionError, match="final_norm='all'"):
        lw.Encoder(vit, final_norm="all")


def test_a_hierarchical_image_model_is_refused_by_name(tmp_path):
    import transformers as T

    config = T.SwinConfig(embed_dim=16, depths=[1, 1], num_heads=[2, 2], image_size=32, patch_size=4)
    T.SwinModel(config).save_pretrained(tmp_path / "swin")
    with pytest.raises(lw.ModelLoadError, match="hierarchical image model"):
        lw.Encoder(tmp_path / "swin")


def test_files_and_stores_take_image_stacks(vit_encoder, images, tmp_path):
    stacks = vit_encoder.extract(images)
    lw.extract_to_file(vit_encoder, images, tmp_path / "v.npz")
    meta = lw.read_meta(tmp_path / "v.npz")
    assert meta["modality"] == "image" and meta["forward"] == "general" and meta["final_norm"] is None
    plan = lw.OutputPlan.parse(layers="all")
    lw.extract_to_store(vit_encoder, images, tmp_path / "v.lw", plan)
    store = lw.open_store(tmp_path / "v.lw")
    for k, stack in enumerate(stacks):
        assert store[k].tokens == stack.tokens and store[k].text == images[k]
        np.testing.assert_allclose(store[k].hidden.astype(np.float32), stack.hidden, atol=2e-2)
        read = store[k].units  # the units back from their names and the store's record
        assert read.kinds == stack.units.kinds and read.grid_shape == (4, 4)
        assert (read.grid == stack.units.grid).all() and read.source == images[k]
    pooled = lw.OutputPlan.parse(layers="-1", pool="sentence:cls")
    lw.extract_to_file(vit_encoder, images, tmp_path / "v.parquet", pooled)
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "v.parquet")
    got = np.stack(table.column("layer_2").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(got, np.stack([s.hidden[-1, 0] for s in stacks]), atol=TOL)


def test_the_command_line_reads_folders_and_globs(vit, images, tmp_path):
    from typer.testing import CliRunner

    from layerwise.cli import app

    folder = str(images[0]).rsplit("/", 1)[0]
    runner = CliRunner()
    out = tmp_path / "cli.npz"
    result = runner.invoke(app, ["extract", folder, "-m", str(vit), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 3 input(s), 51 units x 3 layers" in result.output
    texts = lw.read_npz_texts(np.load(out))
    assert list(texts) == sorted(images)
    store = str(tmp_path / "g.lw")
    result = runner.invoke(app, ["extract", f"{folder}/*.png", "-m", str(vit), "-o", store, "-q"])
    assert result.exit_code == 0, result.output
    assert len(lw.open_store(tmp_path / "g.lw")) == 3
    result = runner.invoke(app, ["extract", f"{folder}/*.gif", "-m", str(vit), "-o", str(tmp_path / "x.npz")])
    assert result.exit_code != 0 and "matches no image" in result.output


def test_info_layers_and_probe_take_an_image_model(images, tmp_path):
    import json

    from typer.testing import CliRunner

    from layerwise.cli import app

    folder = save_image_model("dinov2_with_registers", tmp_path / "dino", seed=1, layers=4)
    runner = CliRunner()
    result = runner.invoke(app, ["info", "-m", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    said = json.loads(result.output)
    assert said["modality"] == "image" and said["forward"] == "general"
    assert said["units"].startswith("before the patches: 1 cls, 4 register; then 4 x 4 patches")
    more = save_images(tmp_path / "more", n=6, seed=2)
    result = runner.invoke(app, ["layers", str(tmp_path / "more"), "-m", str(folder), "-q"])
    assert result.exit_code == 0, result.output
    assert "label-free metrics over 6 images" in result.output
    assert "measured on text encoders" in result.output
    result = runner.invoke(app, ["layers", str(tmp_path / "more"), "-m", str(folder), "--views", "2"])
    assert result.exit_code != 0 and "--views 0" in result.output
    probe = probe_files(more, tmp_path, folder)
    assert probe["n_train"] == 4 and probe["n_dev"] == 2 and probe["unit"] == "images"


def test_the_cache_refuses_an_image_model_and_ray_checks_its_plan_first(vit, vit_encoder, images, tmp_path):
    with pytest.raises(lw.OptionError, match="the activation cache packs a text model's token stream"):
        lw.cache_activations(vit_encoder, images, tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
    # Ray takes image models (tests/test_ray_media.py); a plan they cannot answer fails before any actor
    words = lw.OutputPlan.parse(pool="word:mean")
    with pytest.raises(lw.OptionError, match="an image has no words"):
        lw.ray.extract_to_store(lw.Settings(str(vit)), images, tmp_path / "ray.lw", words)
    assert not (tmp_path / "ray.lw").exists()


def test_clips_text_tower_saved_alone_runs_as_a_text_encoder(tmp_path):
    import torch
    import transformers as T
    from tokenizer_kinds import byte_level

    tokenizer = byte_level("neox")
    config = T.CLIPTextConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        vocab_size=len(tokenizer), max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = T.CLIPTextModel(config).eval()
    model.save_pretrained(tmp_path / "text")  # as CLIPTextModel.from_pretrained(name).save_pretrained does
    tokenizer.save_pretrained(tmp_path / "text")
    texts = ["a photo of a cat", "two dogs playing in the snow at night", "x"]
    enc = lw.Encoder(tmp_path / "text")
    assert enc.modality == "text"
    for method in ("hidden_states", "hooks"):
        for text, stack in zip(texts, enc.extract(texts, method=method), strict=True):
            ids = tokenizer(text, return_tensors="pt")
            with torch.no_grad():
                want = torch.stack(model(**ids, output_hidden_states=True).hidden_states)[:, 0].numpy()
            np.testing.assert_allclose(stack.hidden, want, atol=TOL, rtol=0)
