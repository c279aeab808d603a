"""Hub names on a machine that cannot reach the hub and has no HF_HUB_OFFLINE set (#46, 18): a name
in the local cache loads from it, one that is not fails at once saying why, not after ~25 s of
retries. The hub's address is pointed at a closed loopback port, so nothing leaves the machine."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np

from layerwise._model.loading import hub


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens there once the socket is closed


def _run(code: str, cache, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(
        HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}", HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path)
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )


def test_probe_tells_a_listening_port_from_a_closed_one():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        assert hub._connects("127.0.0.1", server.getsockname()[1])
    assert not hub._connects("127.0.0.1", _closed_port())


def test_uncached_hub_name_fails_at_once_when_the_hub_cannot_be_reached(tmp_path):
    code = (
        # the imports (torch, transformers: seconds on a loaded machine) are not what is timed
        "import time, transformers, layerwise as lw\n"
        "Encoder = lw.Encoder\n"
        "start = time.perf_counter()\n"
        "try:\n    Encoder('no-such-org/no-such-model')\n"
        "except lw.ModelLoadError as exc:\n    print(round(time.perf_counter() - start, 2)); print(exc)\n"
    )
    done = _run(code, tmp_path / "hub", tmp_path)
    assert done.returncode == 0, done.stderr
    seconds, message = done.stdout.split("\n", 1)
    assert float(seconds) < 5, f"took {seconds} s to say the model is not there"
    assert "'no-such-org/no-such-model' is not a local folder and is not in the Hugging Face cache" in message
    assert str(tmp_path / "hub") in message and "the hub cannot be reached" in message
    assert "hf download no-such-org/no-such-model" in message
    assert "Retrying" not in done.stderr


def test_cached_hub_name_loads_from_the_cache_when_the_hub_cannot_be_reached(tmp_path, make_tiny_model):
    folder = make_tiny_model("bert")
    # the layout huggingface_hub writes: models--ORG--NAME/{refs/main, snapshots/REVISION/files}
    repo = tmp_path / "hub" / "models--tiny-org--tiny-bert"
    shutil.copytree(folder, repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    code = (
        "import time, numpy as np, transformers, layerwise as lw\n"
        "Encoder = lw.Encoder\n"
        "start = time.perf_counter()\n"
        "enc = Encoder('tiny-org/tiny-bert', device='cpu')\n"
        "print(round(time.perf_counter() - start, 2), enc.name)\n"
        "np.save('hub.npy', enc.embed(['a cached model, read offline']))\n"
    )
    start = time.perf_counter()
    done = _run(code, tmp_path / "hub", tmp_path)
    assert done.returncode == 0, done.stderr
    seconds, name = done.stdout.split()
    assert name == "tiny-org/tiny-bert" and float(seconds) < 10, (seconds, time.perf_counter() - start)
    import layerwise as lw

    expected = lw.Encoder(folder, device="cpu").embed(["a cached model, read offline"])
    np.testing.assert_allclose(np.load(tmp_path / "hub.npy"), expected, atol=1e-6)
