"""Tiny random image models of every media family, saved with their real processor classes
configured small (32 x 32 inputs, 8 x 8 patches), and images to read: the media tests' models."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
SQUARE = {"height": 32, "width": 32}


def _configs() -> dict:
    import transformers as T

    ffn = dict(intermediate_size=64)
    return {
        "vit": (T.ViTConfig(**SMALL, **ffn), T.ViTImageProcessor(size=SQUARE)),
        "vit_msn": (T.ViTMSNConfig(**SMALL, **ffn), T.ViTImageProcessor(size=SQUARE)),
        "deit": (
            T.DeiTConfig(**SMALL, **ffn),
            T.DeiTImageProcessor(size={"height": 40, "width": 40}, crop_size=SQUARE),
        ),
        "beit": (T.BeitConfig(**SMALL, **ffn), T.BeitImageProcessor(size=SQUARE, do_center_crop=False)),
        "data2vec-vision": (
            T.Data2VecVisionConfig(**SMALL, **ffn),
            T.BeitImageProcessor(size=SQUARE, do_center_crop=False),
        ),
        "dinov2": (
            T.Dinov2Config(**SMALL, mlp_ratio=2),
            T.BitImageProcessor(size={"shortest_edge": 36}, crop_size=SQUARE),
        ),
        "dinov2_with_registers": (
            T.Dinov2WithRegistersConfig(**SMALL, mlp_ratio=2, num_register_tokens=4),
            T.BitImageProcessor(size={"shortest_edge": 36}, crop_size=SQUARE),
        ),
        "ijepa": (T.IJepaConfig(**SMALL, **ffn), T.ViTImageProcessor(size=SQUARE)),
        "clip_vision_model": (
            T.CLIPVisionConfig(**SMALL, **ffn),
            T.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size=SQUARE),
        ),
        "siglip_vision_model": (T.SiglipVisionConfig(**SMALL, **ffn), T.SiglipImageProcessor(size=SQUARE)),
    }


MEDIA_TYPES = (
    "vit", "vit_msn", "deit", "beit", "data2vec-vision", "dinov2", "dinov2_with_registers", "ijepa",
    "clip_vision_model", "siglip_vision_model",
)  # fmt: skip


def save_image_model(model_type: str, folder: Path, seed: int = 0, layers: int = 2) -> Path:
    """A tiny random ``model_type`` image model of ``layers`` layers and its processor, saved in
    ``folder``."""
    import torch
    from transformers import AutoModel

    config, processor = _configs()[model_type]
    config.num_hidden_layers = layers
    torch.manual_seed(seed)
    AutoModel.from_config(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def save_clip(folder: Path, seed: int = 0) -> Path:
    """A tiny random two-tower CLIP model (text and vision), saved with its image processor."""
    import torch
    import transformers as T

    config = T.CLIPConfig(
        text_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64),
        vision_config=dict(**SMALL, intermediate_size=64),
        projection_dim=16,
    )
    torch.manual_seed(seed)
    T.CLIPModel(config).save_pretrained(folder)
    T.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size=SQUARE).save_pretrained(folder)
    return folder


def save_images(folder: Path, n: int = 3, seed: int = 0) -> list[str]:
    """``n`` random RGB PNG images of different sizes in ``folder``: their paths."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for k in range(n):
        pixels = rng.integers(0, 256, size=(40 + 9 * k, 48 + 5 * k, 3), dtype=np.uint8)
        path = folder / f"image{k}.png"
        Image.fromarray(pixels).save(path)
        paths.append(str(path))
    return paths


def reference_states(folder: Path, images: list, model_class=None) -> list[np.ndarray]:
    """transformers' own hidden states of ``images`` (paths), each alone: ``(n_states, units, H)``
    per image, from the folder's processor and model (``model_class``: AutoModel by default)."""
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModel

    processor = AutoImageProcessor.from_pretrained(folder, backend="pil")
    model = (model_class or AutoModel).from_pretrained(folder).eval()
    states = []
    for path in images:
        with Image.open(path) as opened:
            pixels = processor(images=[opened.convert("RGB")], return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            out = model(pixel_values=pixels, output_hidden_states=True)
        states.append(torch.stack(out.hidden_states)[:, 0].numpy())
    return states


def probe_files(files: list[str], folder: Path, model: Path) -> dict:
    """``layerwise probe tsv`` on ``files`` (the first four to train on, the rest to test), labelled
    a, b, a, b, … in a path column: the probe's JSON result."""
    import json

    from typer.testing import CliRunner

    from layerwise.cli import app

    rows = ["path,label", *(f"{path},{'ab'[k % 2]}" for k, path in enumerate(files))]
    (folder / "train.csv").write_text("\n".join(rows[:5]) + "\n")
    (folder / "dev.csv").write_text("\n".join([rows[0], *rows[5:]]) + "\n")
    result = CliRunner().invoke(
        app,
        ["probe", "tsv", "--train", str(folder / "train.csv"), "--dev", str(folder / "dev.csv"),
         "--text-column", "path", "-m", str(model), "--json", str(folder / "probe.json")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads((folder / "probe.json").read_text())
