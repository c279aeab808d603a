"""The explorer's media view: ``POST /v1/explore/media`` equals token_statistics of enc.extract of
the same file, and the page draws an image's patch heat map and a clip's per-layer frame strips in
a real headless Chromium (skipped, saying why, where Chromium or Playwright is missing)."""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("PIL")
pytest.importorskip("soundfile")

from audio_models import RATE, clips, save_audio_model  # noqa: E402
from conftest import running_server  # noqa: E402
from media_models import save_image_model, save_images  # noqa: E402

import layerwise as lw  # noqa: E402
from layerwise.explore import token_statistics  # noqa: E402
from layerwise.serve import create_app  # noqa: E402

pytestmark = pytest.mark.xdist_group("media")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import soundfile

    root = tmp_path_factory.mktemp("explore-media")
    vit = lw.Encoder(save_image_model("dinov2_with_registers", root / "dino"), device="cpu")
    hubert = lw.Encoder(save_audio_model("hubert", root / "hubert", layers=3), device="cpu")
    image = save_images(root / "files", n=1)[0]
    wav = root / "files" / "clip.wav"
    soundfile.write(wav, np.concatenate(clips(3)), RATE, subtype="FLOAT")
    app = create_app({"dino": vit, "hubert": hubert})
    with running_server(app) as url:
        yield {"url": url, "dino": vit, "hubert": hubert, "image": image, "wav": str(wav)}


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def b64(path: str) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def check_statistics(answer: dict, stack) -> None:
    expected = token_statistics(stack)
    for name, values in expected.items():
        got = np.array([[np.nan if v is None else v for v in row] for row in answer["statistics"][name]])
        np.testing.assert_allclose(got, values, atol=2e-5, equal_nan=True)


def test_image_view_equals_token_statistics_of_extract(served):
    response = post(served["url"], "/v1/explore/media", {"model": "dino", "input": b64(served["image"])})
    assert response.status_code == 200, response.text
    answer = response.json()
    stack = served["dino"].extract(served["image"])
    check_statistics(answer, stack)
    assert answer["kinds"][:5] == ["cls", "register", "register", "register", "register"]
    assert answer["grid_shape"] == [4, 4] and answer["grid"][5] == [0, 0]
    assert answer["image"].startswith("data:image/png;base64,")
    from io import BytesIO

    from PIL import Image

    seen = Image.open(BytesIO(base64.b64decode(answer["image"].split(",", 1)[1])))
    assert seen.size == (32, 32)  # the processor's crop: the patches' frame


def test_audio_view_equals_token_statistics_and_gives_the_waveform(served):
    body = {"model": "hubert", "input": "data:audio/wav;base64," + b64(served["wav"])}
    answer = post(served["url"], "/v1/explore/media", body).json()
    stack = served["hubert"].extract(served["wav"])
    check_statistics(answer, stack)
    assert answer["layers"] == [0, 1, 2, 3]
    np.testing.assert_allclose(answer["times"], stack.units.times, atol=1e-6)
    wave = answer["waveform"]
    samples = np.concatenate(clips(3))
    assert wave["seconds"] == pytest.approx(len(samples) / RATE)
    assert max(wave["max"]) == pytest.approx(samples.max(), abs=1e-4)
    assert min(wave["min"]) == pytest.approx(samples.min(), abs=1e-4)


def test_text_views_refuse_media_models_and_info_says_modality(served):
    response = post(served["url"], "/v1/explore/tokens", {"model": "dino", "text": "a cat"})
    assert response.status_code == 422
    assert "/v1/explore/media shows its units" in response.json()["error"]["message"]
    models = httpx.get(served["url"] + "/v1/explore/info").json()["models"]
    assert [(m["id"], m["modality"]) for m in models] == [("dino", "image"), ("hubert", "audio")]


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_page_draws_patches_and_frame_strips(served, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the [test] extra)")
    shots = Path(os.environ.get("LAYERWISE_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1300, "height": 900})
        problems: list[str] = []
        tab.on("pageerror", lambda e: problems.append(str(e)))
        tab.goto(served["url"] + "/?model=dino")
        tab.wait_for_selector("#media-view:not([hidden])")
        assert tab.is_hidden("#grid-view") and tab.is_hidden("#text-form")
        tab.set_input_files("#media-file", served["image"])
        tab.wait_for_selector("#media-canvas[data-ms]")
        assert "16 patches (4 × 4) + [CLS] [REG] [REG] [REG] [REG] × 3 layers" in tab.inner_text(
            "#media-info"
        )
        # the top-left patch's cell is painted with the statistic's colour over the image
        painted = tab.evaluate(
            "() => Array.from(document.querySelector('#media-canvas').getContext('2d')"
            ".getImageData(5, 5, 1, 1).data)"
        )
        assert painted[3] == 255
        tab.screenshot(path=str(shots / "explorer_image.png"))
        tab.select_option("#model", "hubert")
        tab.wait_for_selector("#media-title:text('Frames × layers')")
        tab.set_input_files("#media-file", served["wav"])
        tab.wait_for_selector("#media-info:has-text('frames')")  # the page's own CSP stays on
        info = tab.inner_text("#media-info")
        stack = served["hubert"].extract(served["wav"])
        assert f"{stack.n_tokens} frames" in info and "× 4 layers" in info
        tab.hover("#media-canvas", position={"x": 100, "y": 90 + 14 * 2 + 5})
        assert "L2" in tab.inner_text("#media-readout")
        tab.screenshot(path=str(shots / "explorer_audio.png"))
        browser.close()
        assert not problems, problems
