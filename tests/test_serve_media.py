"""`/v1/layers` of an image and a speech model: base64, data: URLs and file: URLs under --media-root,
each answer equal to transformers' hidden states of the same file; the refusals named."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("PIL")
pytest.importorskip("soundfile")

from audio_models import RATE, clips, save_audio_model  # noqa: E402
from audio_models import reference_states as audio_reference  # noqa: E402
from conftest import run_app as run  # noqa: E402  (an app's requests within its lifespan)
from media_models import reference_states, save_image_model, save_images  # noqa: E402

import layerwise as lw  # noqa: E402
from layerwise.errors import OptionError  # noqa: E402
from layerwise.serve import ServeSettings, create_app  # noqa: E402

pytestmark = pytest.mark.xdist_group("media")


@pytest.fixture(scope="module")
def media(tmp_path_factory, default_encoder):
    """An image model, a speech model and the default text model served together; PNGs and WAVs
    under a --media-root."""
    import soundfile

    root = tmp_path_factory.mktemp("media")
    vit = save_image_model("vit", root / "vit")
    hubert = save_audio_model("hubert", root / "hubert")
    files = root / "files"
    images = save_images(files)
    waves = clips(2)
    wavs = []
    for k, wave in enumerate(waves):
        path = files / f"clip{k}.wav"
        soundfile.write(path, wave, RATE, subtype="FLOAT")
        wavs.append(str(path))
    encoders = {
        "vit": lw.Encoder(vit, device="cpu"),
        "hubert": lw.Encoder(hubert, device="cpu"),
        default_encoder.name: default_encoder,
    }
    return {"root": root, "vit": vit, "hubert": hubert, "images": images, "wavs": wavs, "encoders": encoders}


def post(app, path: str, body: dict, headers: dict | None = None):
    return run(app, lambda client: client.post(path, json=body, headers=headers or {}))


def post_each(app, path: str, bodies: list[dict]) -> list:
    """Each body posted in turn, in one lifespan of ``app``."""

    async def scenario(client):
        return [await client.post(path, json=body) for body in bodies]

    return run(app, scenario)


def decode(array: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(array["data"]), dtype=array["dtype"]).reshape(array["shape"])


def b64(path: str) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def test_images_by_base64_equal_transformers(media):
    app = create_app(media["encoders"], ServeSettings())
    body = {"model": "vit", "images": [b64(p) for p in media["images"]]}
    response = post(app, "/v1/layers", body)
    assert response.status_code == 200, response.text
    answer = response.json()
    expected = reference_states(media["vit"], media["images"])
    assert answer["layers"] == [0, 1, 2]
    for item, states in zip(answer["results"], expected, strict=True):
        hidden = decode(item["hidden"])
        assert hidden.shape == states.shape == (3, 17, 32)
        np.testing.assert_allclose(hidden, states, atol=1e-5)
        assert item["units"][:2] == ["[CLS]", "r0c0"] and item["kinds"][:2] == ["cls", "patch"]
        assert item["grid"][16] == [3, 3] and item["grid_shape"] == [4, 4]
    assert answer["usage"]["prompt_tokens"] == 3 * 17


def test_data_url_and_pool_give_one_vector(media):
    app = create_app(media["encoders"], ServeSettings())
    url = "data:image/png;base64," + b64(media["images"][1])
    response = post(
        app, "/v1/layers", {"model": "vit", "images": [url], "layers": -1, "pool": "sentence:cls"}
    )
    assert response.status_code == 200, response.text
    vector = decode(response.json()["results"][0]["embedding"])
    expected = reference_states(media["vit"], media["images"][1:2])[0][-1, 0]
    np.testing.assert_allclose(vector.reshape(-1), expected, atol=1e-5)


def test_audio_by_file_url_under_media_root_equal_transformers(media):
    app = create_app(media["encoders"], ServeSettings(media_root=media["root"]))
    urls = [Path(p).as_uri() for p in media["wavs"]]
    response = post(app, "/v1/layers", {"model": "hubert", "audio": urls, "layers": "0,-1"})
    assert response.status_code == 200, response.text
    expected = audio_reference(media["hubert"], clips(2))
    for item, states in zip(response.json()["results"], expected, strict=True):
        hidden = decode(item["hidden"])
        np.testing.assert_allclose(hidden, states[[0, -1]], atol=1e-5)
        assert item["kinds"] == ["frame"] * states.shape[1]
        stride, span = media["encoders"]["hubert"].run.frame_seconds
        assert stride == 10 / RATE and item["times"][1] == pytest.approx([stride, stride + span])


def test_npz_answer_of_an_image_model(media):
    app = create_app(media["encoders"], ServeSettings())
    body = {"model": "vit", "images": [b64(media["images"][0])], "layers": -1}
    response = post(app, "/v1/layers", body, {"Accept": "application/x-npz"})
    assert response.status_code == 200, response.text
    npz = np.load(io.BytesIO(response.content))
    hidden = npz["hidden"] if "hidden" in npz.files else npz[npz.files[0]]
    expected = reference_states(media["vit"], media["images"][:1])[0][-1]
    assert np.abs(hidden.reshape(-1, 32)[: expected.shape[0]] - expected).max() < 1e-5


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"model": "vit", "texts": ["a cat"]}, 422, "reads images: send images"),
        ({"model": "vit", "layers": -1}, 422, "reads images: send images"),
        ({"model": "vit", "images": ["AAAA"], "audio": ["AAAA"]}, 422, "not images, audio"),
        ({"model": "hubert", "images": ["AAAA"]}, 422, "reads sound: send audio"),
        ({"model": "all-MiniLM-L6-v2", "images": ["AAAA"]}, 422, "reads text: send texts"),
        ({"model": "vit", "images": ["not base64!"]}, 422, "is not base64"),
        ({"model": "vit", "images": ["file:///etc/passwd"]}, 422, "reads no files"),
        ({"model": "vit", "images": [base64.b64encode(b"no image").decode()]}, 422, "no image Pillow"),
        ({"model": "vit", "images": ["AAAA"], "pool": "word:mean"}, 422, "has no words"),
    ],
)
def test_refusals_name_the_fix(media, body, status, words):
    app = create_app(media["encoders"], ServeSettings())
    response = post(app, "/v1/layers", body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]


def test_file_urls_outside_the_root_are_refused(media, tmp_path):
    app = create_app(media["encoders"], ServeSettings(media_root=media["root"] / "files"))
    outside = (media["root"] / "vit" / "config.json").as_uri()
    sneaky = (media["root"] / "files").as_uri() + "/../vit/config.json"
    bodies = [{"model": "vit", "images": [url]} for url in (outside, sneaky)]
    for response in post_each(app, "/v1/layers", bodies):
        assert response.status_code == 422 and "outside --media-root" in response.json()["error"]["message"]
    with pytest.raises(OptionError, match="is not a folder"):
        ServeSettings(media_root=tmp_path / "missing")


def test_embeddings_route_is_text_only_and_models_say_modality(media):
    app = create_app(media["encoders"], ServeSettings())

    async def scenario(client):
        return await client.post("/v1/embeddings", json={"model": "vit", "input": "a cat"}), await client.get(
            "/v1/models"
        )

    response, models = run(app, scenario)
    assert response.status_code == 422
    assert "/v1/embeddings takes text only" in response.json()["error"]["message"]
    cards = models.json()["data"]
    assert {card["id"]: card["modality"] for card in cards} == {
        "vit": "image",
        "hubert": "audio",
        "sentence-transformers/all-MiniLM-L6-v2": "text",
    }


def test_response_and_request_bounds_count_units(media):
    small = ServeSettings(max_response_bytes=1000, max_request_tokens=40, max_queue_tokens=40)
    app = create_app(media["encoders"], small)
    images = [b64(p) for p in media["images"]]
    many, one = post_each(
        app, "/v1/layers", [{"model": "vit", "images": images}, {"model": "vit", "images": images[:1]}]
    )
    assert many.status_code == 413 and "51 units" in many.json()["error"]["message"]
    assert one.status_code == 413 and "max-response-mb" in one.json()["error"]["message"]
