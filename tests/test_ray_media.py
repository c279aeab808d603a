"""lw.ray with an image and a speech model: embed over a Ray Dataset of images equals
Encoder.embed; extract_to_store of audio files equals Encoder.extract, units and all. Ray runs in
a network namespace with only loopback (tests/ray_media_checks.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("soundfile")

from audio_models import RATE, clips, save_audio_model
from media_models import save_image_model, save_images
from test_ray import _netns_available

import layerwise as lw

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
@pytest.mark.xdist_group("exclusive")  # one Ray at a time under pytest-xdist
def test_ray_embeds_images_and_stores_clips_as_one_process(tmp_path):
    pytest.importorskip("ray")
    import soundfile

    reason = _netns_available()
    if reason:
        pytest.skip(reason)
    vit = save_image_model("vit", tmp_path / "vit")
    hubert = save_audio_model("hubert", tmp_path / "hubert")
    images = save_images(tmp_path / "images", n=5)
    (tmp_path / "clips").mkdir()
    wavs = []
    for k, wave in enumerate(clips(5)):
        wavs.append(str(tmp_path / "clips" / f"clip{k}.wav"))
        soundfile.write(wavs[-1], wave, RATE, subtype="FLOAT")
    script = f"ip link set lo up && {sys.executable} {HERE / 'ray_media_checks.py'} {tmp_path} {vit} {hubert}"
    run = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and (tmp_path / "done").exists(), run.stderr[-3000:]

    # 1. images from ray.data.read_images (arrays), pooled at [CLS]: as Encoder.embed of the files
    paths = (tmp_path / "ray_image_paths.txt").read_text().split()
    assert [Path(p).name for p in paths] == [Path(p).name for p in images]
    expected = lw.Encoder(vit, device="cpu").embed(images, pool="cls", layers="all")
    np.testing.assert_allclose(np.load(tmp_path / "ray_image_vectors.npy"), expected, atol=1e-5)

    # 2. clips by path into a sharded store by two actors: as Encoder.extract, with their frames' times
    store = lw.open_store(tmp_path / "clips.lw")
    assert store.n_shards == 3 and len(store) == 5 and store.verify().ok
    speech = lw.Encoder(hubert, device="cpu")
    for (_, got), want in zip(store.items(), speech.extract(wavs), strict=True):
        np.testing.assert_allclose(got.hidden, want.hidden, atol=1e-5)
        assert got.units is not None and got.units.kinds == want.units.kinds
        np.testing.assert_allclose(got.units.times, want.units.times)
    assert lw.read_meta(tmp_path / "clips.lw")["modality"] == "audio"
