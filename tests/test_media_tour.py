"""The README's tour on an image and a speech model: files a user has, extracted to a store, the
layers ranked without labels, a probe per layer, the explorer's view of one file; for a ViT, a CLIP
vision tower, a wav2vec2 and a Whisper encoder (tiny random models of their real classes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from audio_models import RATE, clips, save_audio_model
from conftest import run_app
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
    _explore(model, files[0])


def _explore(model, path: str) -> None:
    """The explorer's view of ``path`` (as the page asks for it) equals token_statistics of extract."""
    import base64

    pytest.importorskip("httpx")
    from layerwise.explore import token_statistics
    from layerwise.serve import create_app

    enc = lw.Encoder(model)
    app = create_app({"m": enc})
    data = base64.b64encode(Path(path).read_bytes()).decode()

    async def ask(c):
        return await c.post("/v1/explore/media", json={"model": "m", "input": data})

    response = run_app(app, ask)
    assert response.status_code == 200, response.text
    norms = np.array(response.json()["statistics"]["norm"], dtype=np.float64)
    np.testing.assert_allclose(
        norms, token_statistics(enc.extract(path, long_texts="window"))["norm"], rtol=1e-5
    )
