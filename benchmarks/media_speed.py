"""Every layer of an image model and of a speech model: layerwise's ``extract(layers="all")`` beside
the careful hand-written loop on the same files: decoded (Pillow; soundfile), the model's own
processor on a batch, the model under ``torch.inference_mode`` with ``output_hidden_states=True``,
every hidden state of every input kept on the host as float32 NumPy.

    python benchmarks/media_speed.py [--images 64] [--clips 16] [--batch-size 16] [--repeats 3]

Models, randomly initialised with the shapes and cost of the real ones:

- image: ViT-base (transformers' ``ViTConfig()``: 12 layers x 768, 224 x 224 inputs, 16 x 16
  patches: 197 units), as google/vit-base-patch16-224; random RGB PNGs of 320 x 240 pixels, so
  that the processor resizes each;
- speech: HuBERT-base (``HubertConfig()``: 12 layers x 768, its convolutional feature encoder), as
  facebook/hubert-base-ls960; 4-second WAV clips at 16 kHz (199 frames each). Its first convolution
  is group-normalised over time, so clips of one length share a batch, as the loop's do.

Rounds alternate layerwise and the loop; the result is the median time of each, as units (patches,
frames) per second, and their ratio layerwise / loop (above 1: layerwise is faster). Results:
benchmarks/results/media_speed.json.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import interleaved_times, parser, write_result

RATE = 16000


def make_models(root: Path) -> dict[str, Path]:
    import torch
    from transformers import (
        HubertConfig,
        HubertModel,
        ViTConfig,
        ViTImageProcessor,
        ViTModel,
        Wav2Vec2FeatureExtractor,
    )

    torch.manual_seed(0)
    ViTModel(ViTConfig(), add_pooling_layer=False).save_pretrained(root / "vit")
    ViTImageProcessor().save_pretrained(root / "vit")  # resize to 224 x 224, normalise
    HubertModel(HubertConfig()).save_pretrained(root / "hubert")
    Wav2Vec2FeatureExtractor(return_attention_mask=False).save_pretrained(root / "hubert")
    return {"image": root / "vit", "audio": root / "hubert"}


def make_inputs(root: Path, images: int, clips: int) -> dict[str, list[str]]:
    import soundfile
    from PIL import Image

    rng = np.random.default_rng(0)
    (root / "images").mkdir()
    (root / "clips").mkdir()
    made: dict[str, list[str]] = {"image": [], "audio": []}
    for k in range(images):
        path = root / "images" / f"image{k:04d}.png"
        Image.fromarray(rng.integers(0, 256, size=(240, 320, 3), dtype=np.uint8)).save(path)
        made["image"].append(str(path))
    for k in range(clips):
        path = root / "clips" / f"clip{k:04d}.wav"
        soundfile.write(path, (0.1 * rng.standard_normal(4 * RATE)).astype(np.float32), RATE, subtype="FLOAT")
        made["audio"].append(str(path))
    return made


def hand_loop(modality: str, folder: Path, batch_size: int) -> Callable[[list[str]], tuple[int, Any]]:
    """The loop a careful user writes, loaded once: a function of the paths that returns the number
    of units it kept, and the states."""
    import soundfile
    import torch
    from PIL import Image
    from transformers import AutoFeatureExtractor, AutoImageProcessor, AutoModel

    model = AutoModel.from_pretrained(folder).eval()
    if modality == "image":
        processor = AutoImageProcessor.from_pretrained(folder, backend="pil")
    else:
        processor = AutoFeatureExtractor.from_pretrained(folder)

    def batch_inputs(paths: list[str]) -> dict:
        if modality == "image":
            images = []
            for path in paths:
                with Image.open(path) as opened:
                    images.append(opened.convert("RGB"))
            return {"pixel_values": processor(images=images, return_tensors="pt")["pixel_values"]}
        waves = [soundfile.read(path, dtype="float32")[0] for path in paths]
        return {"input_values": processor(waves, sampling_rate=RATE, return_tensors="pt")["input_values"]}

    def run(paths: list[str]) -> tuple[int, Any]:
        kept = []
        with torch.inference_mode():
            for lo in range(0, len(paths), batch_size):
                out = model(**batch_inputs(paths[lo : lo + batch_size]), output_hidden_states=True)
                kept.extend(torch.stack(out.hidden_states, dim=1).numpy())  # (B, 13, units, 768)
        return sum(s.shape[1] for s in kept), kept

    return run


def measure(modality: str, folder: Path, paths: list[str], batch_size: int, repeats: int) -> dict:
    import layerwise as lw

    enc = lw.Encoder(folder, batch_size=batch_size, device="cpu")
    loop = hand_loop(modality, folder, batch_size)
    first = enc.extract(paths[:2])  # the same numbers first: the two give one answer
    _, theirs = loop(paths[:2])
    largest = max(float(np.abs(s.hidden - t).max()) for s, t in zip(first, theirs, strict=True))
    units = sum(s.n_tokens for s in enc.extract(paths[:batch_size])) * len(paths) // batch_size  # warm-up
    loop(paths[:batch_size])

    def ours() -> int:
        return sum(stack.n_tokens for stack in enc.extract(paths, layers="all"))

    times = interleaved_times({"layerwise": ours, "loop": lambda: loop(paths)[0]}, repeats, units)
    medians = {key: statistics.median(values) for key, values in times.items()}
    rates = {key: units / value for key, value in medians.items()}  # units (patches, frames) per second
    ratio = rates["layerwise"] / rates["loop"]
    print(
        f"{modality}: {len(paths)} inputs, every layer kept: layerwise {medians['layerwise']:.2f} s, "
        f"hand-written loop {medians['loop']:.2f} s: layerwise runs {ratio:.2f}x the loop "
        f"(largest difference {largest:.1e})",
        flush=True,
    )
    return {
        "inputs": len(paths),
        "tokens": units,  # units: an image's [CLS] and patches, a clip's frames
        "batch_size": batch_size,
        "seconds": times,
        "tokens_per_s": rates,
        "inputs_per_s": {key: len(paths) / value for key, value in medians.items()},
        "ratios": {"layerwise_over_loop": ratio},
        "largest_difference": largest,
    }


def main() -> None:
    import torch

    args = parser(__doc__)
    args.add_argument("--images", type=int, default=64)
    args.add_argument("--clips", type=int, default=16)
    args.add_argument("--batch-size", type=int, default=16)
    args.add_argument("--repeats", type=int, default=3)
    given = args.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folders = make_models(root)
        paths = make_inputs(root, given.images, given.clips)
        results = {
            modality: measure(modality, folders[modality], paths[modality], given.batch_size, given.repeats)
            for modality in ("image", "audio")
        }
    results["image"]["model"] = "ViT-base-sized (ViTConfig(): 12 layers x 768, 197 units), random weights"
    results["image"]["input"] = "images (random RGB PNGs, 320 x 240 pixels)"
    results["audio"]["model"] = "HuBERT-base-sized (HubertConfig(): 12 layers x 768), random weights"
    results["audio"]["input"] = "clips (4-second WAVs at 16 kHz)"
    write_result("media_speed", {"threads": torch.get_num_threads(), **results})


if __name__ == "__main__":
    main()
