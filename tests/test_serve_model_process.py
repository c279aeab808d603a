"""`layerwise serve` with the models in a process of their own (serve/model_process.py): the same
vectors as in-process, errors that cross the process boundary, a dead process reported, edited
weights refused."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from conftest import run_app  # noqa: E402

import layerwise as lw  # noqa: E402
from layerwise.serve import ServeSettings, create_app  # noqa: E402

TEXTS = ["The bank raised rates.", "She sat on the river bank.", "ok", "A much longer sentence " * 6]


@pytest.fixture(scope="module")
def tiny_pair(make_tiny_model):
    return lw.Encoder(make_tiny_model("bert", 4), device="cpu")


def test_model_process_serves_the_in_process_vectors(default_encoder, tiny_pair):
    """Embeddings and per-layer vectors from the model process equal Encoder().embed/extract, on two
    concurrent forwards, for two models; the runs happened in another process."""
    app = create_app(
        {default_encoder.name: default_encoder, "tiny": tiny_pair},
        ServeSettings(model_process=True, concurrent_forwards=2, long_texts="window"),
    )
    runner = app.state.batcher.runner
    long_text = "the river bank " * 200  # about 600 tokens: windows, stitched in the model process

    async def scenario(client):
        embeddings = await client.post("/v1/embeddings", json={"input": TEXTS})
        layers = await client.post(
            "/v1/layers", json={"model": "tiny", "texts": [*TEXTS, long_text], "layers": "all"}
        )
        many = await asyncio.gather(
            *(client.post("/v1/embeddings", json={"input": [t], "model": "tiny"}) for t in TEXTS * 8)
        )
        return embeddings, layers, many, await client.get("/health")

    embeddings, layers, many, health = run_app(app, scenario)
    assert runner.forwards == 2 and runner.process.pid != os.getpid()
    assert embeddings.status_code == 200, embeddings.text
    got = np.array([item["embedding"] for item in embeddings.json()["data"]])
    np.testing.assert_allclose(got, default_encoder.encode(TEXTS), atol=1e-5)
    assert layers.status_code == 200, layers.text
    want = tiny_pair.extract([*TEXTS, long_text], layers="all", long_texts="window")
    for item, stack in zip(layers.json()["results"], want, strict=True):
        array = item["hidden"]
        hidden = np.frombuffer(__import__("base64").b64decode(array["data"]), dtype=array["dtype"])
        np.testing.assert_allclose(hidden.reshape(array["shape"]), stack.hidden, atol=1e-5)
    assert layers.json()["results"][-1]["n_windows"] > 1
    expected = tiny_pair.embed(TEXTS, layers=-1, pool="mean")
    for i, response in enumerate(many):
        np.testing.assert_allclose(response.json()["data"][0]["embedding"], expected[i % 4], atol=1e-5)
    assert health.status_code == 200
    assert not runner.alive  # the app's shutdown closed the process


def run_on(runner, model, encoded, layers, stride, finish=None):
    """One run on stream 0, as the batcher hands it over (no jobs: results come back as they are)."""
    from layerwise.serve._batcher import Finish, Run
    from layerwise.serve._jobs import Forward

    finishes = [finish or Finish(layers)] * len(encoded)
    runner.start(0, Run([], Forward(model, layers, stride), list(encoded), finishes, [], 0))
    return runner.collect(0)


def test_an_error_in_the_model_process_arrives_as_itself(tiny_pair):
    from layerwise._features.plan import OutputPlan
    from layerwise._inputs.raw import normalize_inputs
    from layerwise.serve._batcher import Finish
    from layerwise.serve._model_process import ProcessRunner

    runner = ProcessRunner({"tiny": tiny_pair}, forwards=1)
    try:
        runner.wait_ready()
        long = tiny_pair.inputs.encode(normalize_inputs(texts=["bank " * 400]), truncate=False)
        with pytest.raises(lw.OptionError, match="stride") as raised:  # raised in the model process
            run_on(runner, "tiny", long, (1,), 10**6)
        with pytest.raises(lw.OptionError) as direct:
            from layerwise._engine.call import Call

            list(tiny_pair.engine.run_inputs(long, Call((1,), "hidden_states", stride=10**6), progress=False))
        assert str(raised.value) == str(direct.value)
        encoded = tiny_pair.inputs.encode(normalize_inputs(texts=["a bank"]))
        ((_, stack),) = run_on(runner, "tiny", encoded, (0, 4), None)  # the stream goes on
        want = tiny_pair.extract(["a bank"], layers=[0, 4])[0].hidden
        np.testing.assert_allclose(stack.hidden, want, atol=1e-5)
        # a Finish picks its layers out of the run's and applies its plan in the process
        plan = OutputPlan.parse(layers=4, pool="sentence:mean")
        ((_, pooled),) = run_on(
            runner, "tiny", encoded, (0, 4), None, Finish((4,), plan, tiny_pair.n_hidden_states)
        )
        want = tiny_pair.embed(["a bank"], layers=4, pool="mean")
        np.testing.assert_allclose(pooled.vector.reshape(-1), want.reshape(-1), atol=1e-5)
    finally:
        runner.close()
    assert runner.process.exitcode == 0


def test_a_dead_model_process_is_a_503_and_health_says_so(tiny_pair):
    app = create_app({"tiny": tiny_pair}, ServeSettings(model_process=True, concurrent_forwards=1))
    runner = app.state.batcher.runner

    async def scenario(client):
        before = await client.post("/v1/embeddings", json={"input": ["a"]})
        os.kill(runner.process.pid, signal.SIGKILL)
        runner.process.join(10)
        after = await client.post("/v1/embeddings", json={"input": ["a"]})
        return before, after, await client.get("/health")

    before, after, health = run_app(app, scenario)
    assert before.status_code == 200
    assert after.status_code == 503 and "model process" in after.json()["error"]["message"]
    assert health.status_code == 503 and health.json()["status"] == "stopped"


def test_weights_edited_after_loading_are_refused_not_silently_served(make_tiny_model):
    """The model process loads from the source; edits made in Python would be lost: refused."""
    import torch

    encoder = lw.Encoder(make_tiny_model("bert", 2), device="cpu")
    with torch.no_grad():
        encoder.model.encoder.layer[0].output.dense.bias.add_(1.0)
    app = create_app({"edited": encoder}, ServeSettings(model_process=True, concurrent_forwards=1))

    async def scenario(client):
        return None

    with pytest.raises(lw.ModelLoadError, match="differ"):
        run_app(app, scenario)
    deadline = time.time() + 10
    while app.state.batcher.runner.alive and time.time() < deadline:
        time.sleep(0.05)
    assert not app.state.batcher.runner.alive
    in_process = create_app({"edited": encoder})  # in-process serves the edited weights

    async def embed(client):
        return await client.post("/v1/embeddings", json={"input": ["a bank"], "pool": "sentence:mean"})

    response = run_app(in_process, embed)
    want = encoder.embed(["a bank"], layers=-1, pool="mean")
    np.testing.assert_allclose([response.json()["data"][0]["embedding"]], want, atol=1e-5)


def test_every_layerwise_error_survives_the_process_boundary():
    """#46, 11: each error a run can raise is pickled to the server with its attributes; one that
    could not be unpickled used to turn into a 503 model_unavailable."""
    import pickle

    import layerwise.serve._model_process  # noqa: F401  (its error class joins the tree)
    from layerwise import errors

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    examples = {
        errors.InputError: {"index": 3, "line": 4},
        errors.NonFiniteError: {"index": 1, "layer": 2},
        errors.StoreDamagedError: {"problems": ["a", "b"], "text_ids": [7]},
    }
    for cls in [errors.LayerwiseError, *subclasses(errors.LayerwiseError)]:
        keywords = next((v for k, v in examples.items() if issubclass(cls, k)), {})
        error = cls("what went wrong", **keywords)
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is cls and str(back) == "what went wrong", cls
        for name, value in keywords.items():
            assert getattr(back, name) == value, (cls, name)


def test_a_nan_from_the_model_process_is_a_500_nonfinite_output(make_tiny_model, tmp_path):
    """The documented status for a NaN the model produced: 500 nonfinite_output, not a 503."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "nan-model"
    shutil.copytree(make_tiny_model("bert", 2), folder)
    weights = load_file(folder / "model.safetensors")
    name = next(k for k in weights if k.endswith("layer.1.output.dense.bias"))
    weights[name][:] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    app = create_app(
        {"nan": lw.Encoder(folder, device="cpu")}, ServeSettings(model_process=True, concurrent_forwards=1)
    )

    async def scenario(client):
        return await client.post("/v1/embeddings", json={"input": ["a bank"]})

    response = run_app(app, scenario)
    assert response.status_code == 500, response.text
    assert response.json()["error"]["code"] == "nonfinite_output" and "NaN or inf" in response.text
