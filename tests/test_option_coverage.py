"""No option is dropped on any back end: every option of ``layerwise extract`` changes what is
written or recorded (``lw.read_meta``) on a file, a store and ``--ray``, or is refused there with a
message naming the option. A new option that is forgotten on one path fails here: the table below
must list every option the command has.

``--ray`` runs through a stand-in for Ray Data that builds each actor in this process from its
pickled constructor arguments, as Ray does on another process: what reaches the actors is exactly
what Ray would carry (tests/test_ray.py runs the real Ray)."""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import asgi_posts
from typer.main import get_command
from typer.testing import CliRunner

import layerwise as lw
from layerwise.cli import app

BACKENDS = ("file", "store", "ray")
TEXTS = [f"text {i} about the river bank" + " and more words" * (i % 4) for i in range(12)]


class _Case(SimpleNamespace):
    """``args`` for a back end (a list, or a function of the back end); ``key``: the metadata entry
    that must change (``corpus``: how the source was read); ``refused``: back ends that refuse it."""


def _cases(other_model: Path) -> dict[str, _Case]:
    sentence = ["--pool", "sentence:mean"]
    return {
        "model": _Case(args=["--model", str(other_model)], key="model"),
        "layers": _Case(args=["--layers", "0,-1"], key="layers"),
        "batch_size": _Case(args=["--batch-size", "3"], key="batch_size"),
        "max_tokens": _Case(args=["--max-tokens", "64"], key="max_tokens"),
        "dtype": _Case(args=lambda b: ["--dtype", "float16" if b == "file" else "float32"], key="dtype"),
        "model_dtype": _Case(args=["--model-dtype", "bfloat16"], key="model_dtype"),
        "max_length": _Case(args=["--max-length", "16"], key="max_length"),
        "method": _Case(args=["--method", "hooks"], key="method"),
        "packed": _Case(args=["--no-packed"], key="packed"),
        "pool": _Case(args=sentence, key="pool"),
        "fuse": _Case(args=[*sentence, "--fuse", "mean_all"], key="fuse"),
        "special_tokens": _Case(args=[*sentence, "--special-tokens", "exclude"], key="special_tokens"),
        "normalize": _Case(args=[*sentence, "--normalize"], key="normalize"),
        "long_texts": _Case(args=["--long-texts", "window"], key="long_texts"),
        "stride": _Case(args=["--long-texts", "window", "--stride", "4"], key="stride"),
        # an encoder has no final norm: refused everywhere, naming it (decoders: test_settings.py)
        "final_norm": _Case(args=["--final-norm", "all"], refused=BACKENDS),
        "device": _Case(args=["--device", "cpu"], key="device"),
        "concurrent_forwards": _Case(args=["--concurrent-forwards", "3"], key="concurrent_forwards"),
        "encoding_errors": _Case(args=["--encoding-errors", "replace"], key="corpus"),
        "format": _Case(args=["--format", "parquet"], key="corpus"),
        "text_column": _Case(args=["--text-column", "other"], key="corpus"),
        "pair_column": _Case(args=["--pair-column", "pair"], key="corpus"),
        "id_column": _Case(args=["--id-column", "doc"], key="corpus"),
        "words_column": _Case(args=["--words-column", "words"], key="corpus"),
        "limit": _Case(args=["--limit", "5"], key="corpus"),
        "on_bad_row": _Case(args=["--on-bad-row", "skip"], key="corpus"),
        "no_text": _Case(args=["--no-text"], key="keep_text", refused=("store", "ray")),
        "overwrite": _Case(args=["--overwrite"], special="overwrite", refused=("file",)),
        "block_size": _Case(args=["--block-size", "4"], key="block_size", refused=("file",)),
        "chunk_rows": _Case(args=["--chunk-rows", "8"], key="chunk_rows", refused=("file",)),
        "shard_chunks": _Case(args=["--shard-chunks", "2"], key="shard_chunks", refused=("file",)),
        "workers": _Case(args=["--workers", "1"], key="workers", refused=("file", "store")),
        "threads_per_worker": _Case(
            args=["--threads-per-worker", "2"], key="threads_per_worker", refused=("file", "store")
        ),
        "shard_size": _Case(args=["--shard-size", "4"], key="shard_size", refused=("file", "store")),
        "allow_nan": _Case(args=["--allow-nan"], key="allow_nan"),
        "streaming": _Case(args=["--streaming"], key="streaming"),
        "max_device_memory": _Case(
            args=["--streaming", "--max-device-memory", "64MB"], key="max_device_memory"
        ),
        "stream_block_tokens": _Case(
            args=["--streaming", "--stream-block-tokens", "64"], key="stream_block_tokens"
        ),
        # the whole model on one device, or on disk (read from the checkpoint in place): same numbers
        "device_map": _Case(args=["--device-map", '{"": "cpu"}'], key="device_map"),
        "offload_folder": _Case(
            args=["--device-map", '{"": "disk"}', "--offload-folder", tempfile.mkdtemp(prefix="lw-test-")],
            key="offload_folder",
        ),
        # bitsandbytes runs on CUDA only: refused on this CPU, naming it (test_placement.py)
        "quantize": _Case(args=["--quantize", "8bit"], refused=BACKENDS),
        # the model's own code may run (none here): recorded, the numbers unchanged
        "trust_remote_code": _Case(args=["--trust-remote-code"], key="trust_remote_code"),
        "quiet": _Case(args=["--quiet"], special="quiet"),
    }


# what the command takes that is not an option to vary: the input, the output, and the back end
STRUCTURAL = {"inputs", "output", "ray"}
# the earlier name of --concurrent-forwards, hidden, warns and sets it (tests/test_concurrent_forwards.py)
DEPRECATED = {"streams"}


class _FakeDataset:
    """Ray Data's ``from_items(...).map_batches(Actor, fn_constructor_args=...)``, in this process:
    one actor, built from its arguments after a pickle round trip (what Ray ships), fed one row per
    batch."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def map_batches(self, fn, *, fn_constructor_args=(), **options: object):
        import torch

        # map_batches' own arguments only: anything else goes to ray.remote as ray_remote_args,
        # deprecated (RayDeprecationWarning on every run) and removed in Ray 2.64 (#46, 24)
        allowed = {"batch_size", "compute", "batch_format", "num_cpus", "num_gpus", "concurrency"}
        assert set(options) <= allowed, f"ray_remote_args passed to map_batches: {set(options) - allowed}"

        threads = torch.get_num_threads()  # the actor sets its own: this process keeps its count
        try:
            actor = fn(*pickle.loads(pickle.dumps(fn_constructor_args)))
            out = []
            for row in self.rows:
                answer = actor({key: [value] for key, value in row.items()})
                out.append({key: values[0] for key, values in answer.items()})
        finally:
            torch.set_num_threads(threads)
        return SimpleNamespace(take_all=lambda: out)


def _fake_ray() -> SimpleNamespace:
    context = SimpleNamespace(enable_progress_bars=True, execution_options=SimpleNamespace())
    data = SimpleNamespace(
        from_items=lambda rows, **_: _FakeDataset(rows),
        ActorPoolStrategy=lambda **_: None,
        DataContext=SimpleNamespace(get_current=lambda: context),
        Dataset=type("Dataset", (), {}),
    )
    return SimpleNamespace(data=data, is_initialized=lambda: True)


@pytest.fixture()
def fake_ray(monkeypatch):
    from layerwise.ray import _drivers, _runtime

    for module in (_runtime, _drivers):  # where init() and the drivers look Ray up
        monkeypatch.setattr(module, "import_ray", _fake_ray)


def _corpus(folder: Path) -> Path:
    """A Parquet corpus with every column an option can name."""
    path = folder / "corpus.parquet"
    table = pa.table(
        {
            "text": TEXTS,
            "other": [t.upper() for t in TEXTS],
            "pair": [f"second segment {i}" for i in range(len(TEXTS))],
            "doc": [f"doc-{i}" for i in range(len(TEXTS))],
            "words": [t.split() for t in TEXTS],
        }
    )
    pq.write_table(table, path)
    return path


def _run(model: Path, corpus: Path, out: Path, backend: str, *args: str):
    where = {"file": [], "store": [], "ray": ["--ray", "local"]}[backend]
    command = ["extract", str(corpus), "-o", str(out), "--model", str(model), *where, *args]
    return CliRunner().invoke(app, [str(a) for a in command])


def _output(folder: Path, backend: str, name: str) -> Path:
    return folder / (f"{name}.npz" if backend == "file" else f"{name}.lw")


def test_the_table_lists_every_option(make_tiny_model):
    command = get_command(app).commands["extract"]  # type: ignore[attr-defined]
    names = {param.name for param in command.params}
    assert names == set(_cases(make_tiny_model("bert", 2))) | STRUCTURAL | DEPRECATED, (
        "an option of `layerwise extract` is not in tests/test_option_coverage.py: say what it changes "
        "on each back end, or refuse it there"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_option_changes_the_output_or_is_refused(tmp_path, make_tiny_model, fake_ray, backend):
    model = make_tiny_model("bert", 3)
    corpus = _corpus(tmp_path)
    baseline = _output(tmp_path, backend, "baseline")
    result = _run(model, corpus, baseline, backend)
    assert result.exit_code == 0, result.output
    base_meta = lw.read_meta(baseline)
    failures = []
    for option, case in _cases(make_tiny_model("bert", 2)).items():
        args = case.args(backend) if callable(case.args) else case.args
        out = _output(tmp_path, backend, option)
        if getattr(case, "special", None) == "overwrite" and backend != "file":
            first = _run(model, corpus, out, backend)  # a store with other settings exists ...
            assert first.exit_code == 0, first.output
            again = _run(
                model, corpus, out, backend, "--layers", "0"
            )  # ... resuming it with others is refused
            assert again.exit_code == 2 and "overwrite" in again.output, again.output
            result = _run(model, corpus, out, backend, "--layers", "0", *args)
            if result.exit_code != 0 or lw.read_meta(out)["layers"] != [0]:
                failures.append(f"{option} on {backend}: {result.output.strip()[:200]}")
            continue
        result = _run(model, corpus, out, backend, *args)
        if backend in getattr(case, "refused", ()):
            flag = "--" + option.replace("_", "-")
            named = flag in result.output or option in result.output
            if result.exit_code != 2 or not named or out.exists():
                failures.append(f"{option} on {backend} should be refused naming it: {result.output[:200]!r}")
            continue
        if result.exit_code != 0:
            failures.append(f"{option} on {backend} failed: {result.output.strip()[:300]}")
            continue
        if getattr(case, "special", None) == "quiet":
            if result.output.strip():
                failures.append(f"--quiet on {backend} still printed {result.output[:100]!r}")
            continue
        meta = lw.read_meta(out)
        if meta.get(case.key) == base_meta.get(case.key):
            failures.append(
                f"{option} on {backend} was dropped: {case.key}={meta.get(case.key)!r} as without it"
            )
    assert not failures, "\n".join(failures)


SERVE_CASES = {
    "model": ["--model", "some/model"],
    "host": ["--host", "127.0.0.2"],
    "port": ["--port", "8123"],
    "api_key_file": ["--api-key-file", "KEYFILE"],
    "max_batch_tokens": ["--max-batch-tokens", "100"],
    "max_wait_ms": ["--max-wait-ms", "7"],
    "max_inputs": ["--max-inputs", "3"],
    "max_request_tokens": ["--max-request-tokens", "99"],
    "max_queue_tokens": ["--max-queue-tokens", "200000"],
    "max_body_mb": ["--max-body-mb", "1"],
    "max_response_mb": ["--max-response-mb", "2"],
    "max_queue_mb": ["--max-queue-mb", "300"],
    "max_explore_tokens": ["--max-explore-tokens", "77"],
    "header_timeout": ["--header-timeout", "3"],
    "body_timeout": ["--body-timeout", "4"],
    "long_texts": ["--long-texts", "window"],
    "stride": ["--long-texts", "window", "--stride", "64"],
    "max_length": ["--max-length", "32"],
    "device": ["--device", "cpu"],
    "model_dtype": ["--model-dtype", "bfloat16"],
    "final_norm": ["--final-norm", "all"],
    "concurrent_forwards": ["--concurrent-forwards", "2"],
    "model_process": ["--in-process"],
    "store": ["--store", "STORE"],
    "media_root": ["--media-root", "STORE"],  # a folder
    "batch_size": ["--batch-size", "5"],
    "max_tokens": ["--max-tokens", "99"],
    "packed": ["--no-packed"],
    "allow_nan": ["--allow-nan"],
    "method": ["--method", "hooks"],
    "device_map": ["--device-map", "auto"],
    "offload_folder": ["--device-map", "auto", "--offload-folder", "STORE"],
    "quantize": ["--quantize", "4bit"],
    "trust_remote_code": ["--trust-remote-code"],
}
# refused by the server, naming why (a streamed model cannot answer interactively)
SERVE_REFUSED = {
    "streaming": ["--streaming"],
    "max_device_memory": ["--streaming", "--max-device-memory", "64MB"],
    "stream_block_tokens": ["--streaming", "--stream-block-tokens", "64"],
}


def test_every_serve_option_reaches_the_server(monkeypatch, tmp_path):
    """Each option of `layerwise serve` changes the server's settings, its models' Settings, what it
    serves from or where it listens: none is accepted and dropped."""
    import layerwise._encoder
    from layerwise._model.loading.source import pick_device
    from layerwise.cli import _serve as cli_serve

    class Loaded:  # an Encoder that loads nothing: what matters is the Settings it is made from
        model = None

        def __init__(self, settings):
            self.settings, self.name = settings, settings.model or "default"
            self.device = pick_device(settings.device)

        @classmethod
        def from_settings(cls, settings):
            return cls(settings)

    seen: list[dict] = []
    monkeypatch.setattr(layerwise._encoder, "Encoder", Loaded)
    monkeypatch.setattr(
        "layerwise.serve.create_app",
        lambda encoders, settings, **kw: seen.append(
            {"settings": settings, "models": [e.settings for e in encoders.values()], **kw}
        ),
    )
    monkeypatch.setattr(
        cli_serve, "_run_server", lambda app, host, port, settings, *a: seen[-1].update(host=host, port=port)
    )
    (tmp_path / "key.txt").write_text("a-key-of-sixteen-chars-or-more\n")
    command = get_command(app).commands["serve"]  # type: ignore[attr-defined]
    assert {p.name for p in command.params} == set(SERVE_CASES) | set(SERVE_REFUSED) | DEPRECATED, (
        "a serve option is not listed"
    )
    for option, args in SERVE_REFUSED.items():
        refused = CliRunner().invoke(app, ["serve", *args])
        assert (
            refused.exit_code == 2 and "streamed" in refused.output and "interactively" in refused.output
        ), option

    def served(*args: str) -> dict:
        result = CliRunner().invoke(app, ["serve", *args])
        assert result.exit_code == 0, result.output
        return seen[-1]

    baseline = served()
    dropped = []
    for option, args in SERVE_CASES.items():
        args = [
            str(tmp_path / "key.txt") if a == "KEYFILE" else str(tmp_path) if a == "STORE" else a
            for a in args
        ]
        if served(*args) == baseline:
            dropped.append(option)
    assert not dropped, f"serve options accepted and dropped: {dropped}"
    assert served("--long-texts", "window", "--stride", "64")["settings"].stride == 64
    refused = CliRunner().invoke(app, ["serve", "--stride", "64"])  # as extract refuses it
    assert refused.exit_code == 2 and "applies to sliding windows only" in refused.output


# every field of the HTTP bodies: a value that changes the response, or is refused naming the field
LAYERS_CASES = {
    "model": {"model": "dec"},
    "texts": {"texts": ["another text entirely"]},
    "text_pairs": {"text_pairs": ["a second segment"]},
    "pairs": {"texts": None, "pairs": [["a first", "a second"]]},
    "words": {"texts": None, "words": [["pre", "split", "words"]]},
    "images": {"texts": None, "images": ["AAAA"]},  # refused: a text model reads texts
    "audio": {"texts": None, "audio": ["AAAA"]},  # (tests/test_serve_media.py serves them)
    "layers": {"layers": "0"},
    "pool": {"pool": "word:mean"},
    "fuse": {"pool": "sentence:mean", "fuse": "mean_all"},
    "special_tokens": {"pool": "sentence:mean", "special_tokens": "exclude"},
    "normalize": {"pool": "sentence:mean", "normalize": True},
    "dtype": {"dtype": "float16"},
    "final_norm": {"model": "dec", "final_norm": "all"},
}
EMBEDDINGS_CASES = {
    "input": {"input": ["another text entirely"]},
    "model": {"model": "dec"},
    "encoding_format": {"encoding_format": "base64"},
    "dimensions": {"dimensions": 7},  # refused: layerwise does not cut vectors
    "layers": {"layers": 0},
    "pool": {"pool": "sentence:max"},
    "fuse": {"fuse": "mean_all"},
    "special_tokens": {"special_tokens": "exclude"},
    "normalize": {"normalize": True},
    "final_norm": {"final_norm": "all"},  # refused for the encoder
}
# OpenAI's end-user id: clients send it; an embedding has nothing to do with it
ACCEPTED_FOR_COMPATIBILITY = {"user"}


def test_every_http_field_changes_the_answer_or_is_refused(tiny_encoder, decoder_encoder):
    pytest.importorskip("fastapi")
    from layerwise.serve import ServeSettings, create_app
    from layerwise.serve._schemas import EmbeddingsRequest, LayersRequest

    assert set(LayersRequest.model_fields) == set(LAYERS_CASES), "a /v1/layers field is not in LAYERS_CASES"
    assert set(EmbeddingsRequest.model_fields) == set(EMBEDDINGS_CASES) | ACCEPTED_FOR_COMPATIBILITY
    app = create_app(
        {"enc": tiny_encoder, "dec": decoder_encoder("llama")}, ServeSettings(model_process=False)
    )
    base = {"/v1/layers": {"model": "enc", "texts": ["The bank raised rates."]},
            "/v1/embeddings": {"model": "enc", "input": ["The bank raised rates."]}}  # fmt: skip
    both = (("/v1/layers", LAYERS_CASES), ("/v1/embeddings", EMBEDDINGS_CASES))
    requests = [(path, {**base[path], **change}) for path, cases in both for change in cases.values()]

    asked = [
        (path, {k: v for k, v in body.items() if v is not None}) for path, body in [*base.items(), *requests]
    ]
    answered = asgi_posts(app, asked)
    answers = {(path, repr(body)): answer for (path, body), answer in zip(asked, answered, strict=True)}
    baseline = {path: answers[(path, repr(body))].json() for path, body in base.items()}
    dropped = []
    for path, cases in (("/v1/layers", LAYERS_CASES), ("/v1/embeddings", EMBEDDINGS_CASES)):
        for field, change in cases.items():
            body = {k: v for k, v in {**base[path], **change}.items() if v is not None}
            response = answers[(path, repr(body))]
            if response.status_code == 422:
                if field not in response.text:
                    dropped.append(f"{path} {field}: refused without naming it: {response.text[:120]}")
            elif response.status_code != 200 or response.json() == baseline[path]:
                dropped.append(f"{path} {field}: {response.status_code}, the same answer as without it")
    assert not dropped, "\n".join(dropped)


# every command that loads a model, with the least it needs to get there
MODEL_COMMANDS = {
    "extract": ["extract", "TEXTS", "-o", "OUT/v.npz"],
    "cache": ["cache", "TEXTS", "-o", "OUT/cache"],
    "layers": ["layers", "TEXTS"],
    "analyze": ["analyze", "TEXTS", "-o", "OUT/report"],
    "plot": ["plot", "TEXTS", "-o", "OUT/p.png", "--words", "bank"],
    "show": ["show", "the river bank"],
    "probe conllu": ["probe", "conllu", "--train", "TEXTS", "--dev", "TEXTS"],
    "probe conll": ["probe", "conll", "--train", "TEXTS", "--dev", "TEXTS"],
    "probe tsv": ["probe", "tsv", "--train", "TEXTS", "--dev", "TEXTS"],
    "probe pairs": ["probe", "pairs", "--data", "TEXTS"],
    "serve": ["serve"],
    "explore": ["explore", "--no-open"],
}
# each model option, and the Settings field it must set
MODEL_OPTION_VALUES = {
    "model": (["--model", "some/model"], "some/model"),
    "device": (["--device", "cpu"], "cpu"),
    "model_dtype": (["--model-dtype", "bfloat16"], "bfloat16"),
    "max_length": (["--max-length", "16"], 16),
    "batch_size": (["--batch-size", "3"], 3),
    "max_tokens": (["--max-tokens", "64"], 64),
    "packed": (["--no-packed"], False),
    "concurrent_forwards": (["--concurrent-forwards", "3"], 3),
    "allow_nan": (["--allow-nan"], True),
    "final_norm": (["--final-norm", "all"], "all"),
    "method": (["--method", "hooks"], "hooks"),
    # streaming is left out: it refuses --no-packed above (tests/test_streamed.py runs it)
    "max_device_memory": (["--max-device-memory", "4GB"], "4GB"),
    "stream_block_tokens": (["--stream-block-tokens", "64"], 64),
}


class _Loading(lw.errors.LayerwiseError):
    """Raised where the model would load: the test has seen the Settings it is made from."""


@pytest.mark.parametrize("name", MODEL_COMMANDS)
def test_every_command_that_loads_a_model_takes_every_model_option(name, tmp_path, monkeypatch):
    """One group of model options, declared once (cli/options.py): every command takes all of them,
    and each reaches the Settings its model is made from."""
    from layerwise.cli._options import model_option_names

    # the options are made from the fields: the table sets these; tests/test_new_setting.py adds a
    # field and follows it through every command
    assert set(MODEL_OPTION_VALUES) <= set(model_option_names())
    texts = tmp_path / "texts.txt"
    texts.write_text("the river bank\nthe bank of England\n")
    args = [str(texts) if a == "TEXTS" else a.replace("OUT", str(tmp_path)) for a in MODEL_COMMANDS[name]]
    command = get_command(app)
    for word in args[: 2 if name.startswith("probe") else 1]:
        command = command.commands[word]  # type: ignore[attr-defined]
    assert set(model_option_names()) <= {p.name for p in command.params}, f"{name} lacks model options"
    seen: list = []

    def loading(cls, settings):
        seen.append(settings)
        raise _Loading("loading")

    monkeypatch.setattr(lw.Encoder, "from_settings", classmethod(loading))
    given = [a for flag, _ in MODEL_OPTION_VALUES.values() for a in flag]
    result = CliRunner().invoke(app, [*args, *given])
    assert result.exit_code == 2 and "loading" in result.output, result.output
    wrong = {
        field: getattr(seen[-1], field)
        for field, (_, value) in MODEL_OPTION_VALUES.items()
        if getattr(seen[-1], field) != value
        and not (name in ("serve", "explore") and field == "concurrent_forwards")
    }
    assert not wrong, f"{name}: options that did not reach the model's Settings: {wrong}"
