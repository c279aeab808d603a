"""The README's tour on an image and a speech model: files a user has, extracted to a store, the
layers ranked without labels, a probe per layer; for a ViT, a CLIP vision tower, a wav2vec2 and a
Whisper encoder (tiny random models of their real classes)."""

from __future__ import annotations

import numpy as np
import pytest
from audio_models import RATE, clips, save_audio_model
from media_models import probe_files, save_image_model, save_images
from typer.testing import CliRunner

import layerwise as lw
from layerwise.cli import app

pytestmark = pytest.mark.slow


def _files(modality: str, folder) -> list[str]:
    if modality == "image":
        return save_images(folder, n=6, seed=3)
    import soundfile

    folder.mkdir(parents=True)
    paths = []
    for k, wave in enumerate(clips(6, seed=3)):
        paths.append(str(folder / f"clip{k}.flac"))
        soundfile.write(paths[-1], wave, RATE)
    return paths


@pytest.mark.parametrize(
    ("model_type", "modality"),
    [("vit", "image"), ("clip_vision_model", "image"), ("wav2vec2", "audio"), ("whisper", "audio")],
)
def test_extract_store_layers_probe(model_type, modality, tmp_path):
    if modality == "image":
        model = save_image_model(model_type, tmp_path / "model", layers=4)
    else:
        model = save_audio_model(model_type, tmp_path / "model", layers=4)
    files = _files(modality, tmp_path / "files")
    runner = CliRunner()
    store = tmp_path / "files.lw"
    given = str(tmp_path / "files")
    result = runner.invoke(app, ["extract", given, "-m", str(model), "-o", str(store), "-q"])
    assert result.exit_code == 0, result.output
    opened = lw.open_store(store)
    want = lw.Encoder(model).extract(files[0])
    assert opened[0].tokens == want.tokens
    np.testing.assert_allclose(opened[0].hidden.astype(np.float32), want.hidden, atol=2e-2)
    result = runner.invoke(app, ["layers", str(tmp_path / "files"), "-m", str(model), "-q"])
    assert result.exit_code == 0, result.output
    assert "label-free metrics over 6" in result.output
    said = probe_files(files, tmp_path, model)
    assert said["n_train"] == 4 and said["unit"] == ("images" if modality == "image" else "clips")
