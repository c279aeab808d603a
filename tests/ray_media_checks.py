"""The Ray runs of tests/test_ray_media.py, in a network namespace with only loopback:

    unshare -n sh -c 'ip link set lo up && python tests/ray_media_checks.py OUT IMAGE_MODEL SPEECH_MODEL'

1. ``lw.ray.embed`` of a Ray Dataset of images (``ray.data.read_images``: arrays) with an image
   model, pool ``sentence:cls``, saved for comparison with ``Encoder.embed``;
2. ``lw.ray.extract_to_store`` of a list of WAV paths with a speech model: a sharded store, two
   actors, compared with ``Encoder.extract`` outside the namespace.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import layerwise as lw


def main() -> None:
    out, image_model, speech_model = (Path(a) for a in sys.argv[1:4])
    lw.ray.init("local", workers=2)
    import ray

    images = sorted(str(p) for p in (out / "images").glob("*.png"))
    ds = ray.data.read_images(images, mode="RGB", include_paths=True)
    plan = lw.OutputPlan.parse(layers="all", pool="sentence:cls")
    rows = lw.ray.embed(
        ds, lw.Settings(model=str(image_model)), plan, column="image", workers=1, batch_size=2
    )
    taken = sorted(rows.take_all(), key=lambda row: row["path"])
    np.save(out / "ray_image_vectors.npy", np.stack([row["embedding"] for row in taken]))
    (out / "ray_image_paths.txt").write_text("\n".join(row["path"] for row in taken) + "\n")

    wavs = sorted(str(p) for p in (out / "clips").glob("*.wav"))
    settings = lw.Settings(model=str(speech_model))
    tokens = lw.OutputPlan.parse(layers="all", pool="token", dtype="float32")
    lw.ray.extract_to_store(settings, wavs, out / "clips.lw", tokens, workers=2, shard_size=2)
    (out / "done").write_text("ok")


if __name__ == "__main__":
    main()
