"""Every layer of an image model: layerwise's ``extract(layers="all")`` beside the careful
hand-written loop on the same images: PNG files decoded by Pillow, the model's own processor on a
batch, the model under ``torch.inference_mode`` with ``output_hidden_states=True``, every hidden
state of every image kept on the host as float32 NumPy.

    python benchmarks/media_speed.py [--images 96] [--batch-size 32] [--repeats 3]

The model is ViT-base-sized (transformers' ``ViTConfig()``: 12 layers x 768, 224 x 224 inputs,
16 x 16 patches: 197 units), randomly initialised: the same shapes and cost as
google/vit-base-patch16-224. The images are random RGB PNGs of 320 x 240 pixels, so that the
processor resizes each. Rounds alternate the two; the result is the median time of each and the
ratio loop / layerwise (above 1: layerwise is faster). Results: benchmarks/results/media_speed.json.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import interleaved_times, parser, write_result


def make_model(folder: Path) -> Path:
    import torch
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    torch.manual_seed(0)
    ViTModel(ViTConfig(), add_pooling_layer=False).save_pretrained(folder)
    ViTImageProcessor().save_pretrained(folder)  # resize to 224 x 224, normalise
    return folder


def make_images(folder: Path, n: int) -> list[str]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for k in range(n):
        path = folder / f"image{k:04d}.png"
        Image.fromarray(rng.integers(0, 256, size=(240, 320, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


def hand_loop(folder: Path, batch_size: int):
    """The loop a careful user writes, loaded once: returns a function of the image paths that
    gives the number of units it kept."""
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModel

    processor = AutoImageProcessor.from_pretrained(folder, backend="pil")
    model = AutoModel.from_pretrained(folder).eval()

    def run(paths: list[str]) -> int:
        kept = []
        with torch.inference_mode():
            for lo in range(0, len(paths), batch_size):
                images = []
                for path in paths[lo : lo + batch_size]:
                    with Image.open(path) as opened:
                        images.append(opened.convert("RGB"))
                pixels = processor(images=images, return_tensors="pt")["pixel_values"]
                out = model(pixel_values=pixels, output_hidden_states=True)
                states = torch.stack(out.hidden_states, dim=1).numpy()  # (B, 13, 197, 768)
                kept.extend(states)
        return sum(s.shape[1] for s in kept)

    return run


def main() -> None:
    import torch

    import layerwise as lw

    args = parser(__doc__)
    args.add_argument("--images", type=int, default=96)
    args.add_argument("--batch-size", type=int, default=32)
    args.add_argument("--repeats", type=int, default=3)
    given = args.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_model(Path(tmp) / "vit-base")
        paths = make_images(Path(tmp) / "images", given.images)
        enc = lw.Encoder(folder, batch_size=given.batch_size, device="cpu")
        loop = hand_loop(folder, given.batch_size)
        n_units = given.images * 197

        def layerwise_run() -> int:
            return sum(stack.n_tokens for stack in enc.extract(paths, layers="all"))

        layerwise_run(), loop(paths[: given.batch_size])  # warm-up: one batch each
        # the same numbers first: the two give one answer
        ours = enc.extract(paths[:2], layers="all")
        with torch.inference_mode():
            from PIL import Image
            from transformers import AutoImageProcessor, AutoModel

            processor = AutoImageProcessor.from_pretrained(folder, backend="pil")
            model = AutoModel.from_pretrained(folder).eval()
            images = [Image.open(p).convert("RGB") for p in paths[:2]]
            out = model(**processor(images=images, return_tensors="pt"), output_hidden_states=True)
            theirs = torch.stack(out.hidden_states, dim=1).numpy()
        largest = max(float(np.abs(s.hidden - t).max()) for s, t in zip(ours, theirs, strict=True))
        times = interleaved_times(
            {"layerwise": layerwise_run, "loop": lambda: loop(paths)}, given.repeats, n_units
        )
    medians = {key: statistics.median(values) for key, values in times.items()}
    ratio = medians["loop"] / medians["layerwise"]
    print(
        f"{given.images} images, every layer kept: layerwise {medians['layerwise']:.2f} s, hand-written loop "
        f"{medians['loop']:.2f} s: loop / layerwise {ratio:.2f}x (largest difference {largest:.1e})"
    )
    write_result(
        "media_speed",
        {
            "model": "ViT-base-sized (ViTConfig(): 12 layers x 768, 197 units), random weights",
            "images": given.images,
            "image_size": [320, 240],
            "batch_size": given.batch_size,
            "threads": torch.get_num_threads(),
            "rounds": times,
            "median_s": medians,
            "images_per_s": {key: given.images / value for key, value in medians.items()},
            "loop_over_layerwise": ratio,
            "largest_difference": largest,
        },
    )


if __name__ == "__main__":
    main()
