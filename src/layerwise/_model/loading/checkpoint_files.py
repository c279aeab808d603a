"""The safetensors files of a checkpoint, checked before any weight is read, in memory (source.py)
and streamed (streaming/checkpoint.py): which file holds which tensor is read from the files' own
headers, and the index must agree with them. A file cut short, a header that is not one, a shard
missing, an index that is not JSON, that leaves a tensor out, places it in another file or names
one no file holds: each is named, file and all, with the fix; transformers would name the folder,
or load the damaged index without a word. So are a pickle weights file and a folder's JSON files
(config, tokenizer) that transformers fails to read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ...errors import ModelLoadError

INDEX = "model.safetensors.index.json"
_FIX = "download the model again, or save it with model.save_pretrained(folder)"


def check_checkpoint_files(source: str, name: str) -> None:
    """Refuse, naming the file, a damaged ``model.safetensors`` or sharded checkpoint of ``source``
    (a folder, or a hub name in the local cache); nothing to check for other formats."""
    from .light import weights_file

    single = weights_file(source)
    if single is not None:
        header_keys(single, name)
    elif Path(source).is_dir() and (Path(source) / INDEX).is_file():
        indexed(Path(source), name)


# the JSON files of a model folder that transformers reads (weights indexes: checkpoint_files.py)
_JSON_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "generation_config.json",
    "sentence_bert_config.json",
)


def damaged_json(folder: Path) -> ModelLoadError | None:
    """A JSON file of ``folder`` that is not JSON, named (transformers names the folder, or nothing)."""
    for file in _JSON_FILES:
        path = folder / file
        if not path.is_file():
            continue
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            return ModelLoadError(
                f"model {str(folder)!r}: its file {path} is not JSON ({type(exc).__name__}: {exc}); it is "
                "damaged or incomplete: download the model again, or save the model and its tokenizer "
                "with save_pretrained(folder)"
            )
    return None


def pickled_weights(source: str) -> list[Path]:
    """The pickle weights files (pytorch_model*.bin) a folder without safetensors is loaded from."""
    folder = Path(source)
    if any(folder.glob("*.safetensors")):
        return []
    return sorted(folder.glob("pytorch_model*.bin"))


def indexed(folder: Path, name: str) -> dict[str, Path]:
    """Tensor name -> file of a sharded checkpoint, from the headers of the files the index lists.
    Refused, naming the file: an index that is not one, a file outside the folder or missing, a
    damaged file; and an index that disagrees with the files (a tensor placed in a file that does
    not hold it, or that no file holds; a tensor a file holds that the index leaves out). The
    numbers may come out right anyway, as transformers reads whole files; but an index that is
    wrong is a download that is wrong."""
    index = folder / INDEX
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        listed = {str(key): str(file) for key, file in weight_map.items()}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(
            f"model {name!r}: {index} is not a safetensors index ({type(exc).__name__}: {exc}); it is "
            f"damaged: {_FIX}"
        ) from None
    root = folder.resolve()
    holders: dict[str, list[Path]] = {}  # a tensor -> the files that hold it, in the index's order
    for file in sorted(set(listed.values())):
        path = (folder / file).resolve()
        if not path.is_relative_to(root):
            raise ModelLoadError(
                f"model {name!r}: {index} names {file!r}, outside {folder}; the index is damaged"
            )
        for key in header_keys(path, name):
            holders.setdefault(key, []).append(path)
    for key, file in listed.items():
        if (folder / file).resolve() not in holders.get(key, ()):
            held = holders.get(key)
            where = f"{held[0].name} holds it" if held else "no file it lists holds it"
            raise ModelLoadError(
                f"model {name!r}: {index} places {key!r} in {file}, which does not hold it ({where}); "
                f"the index and the weights files do not agree: {_FIX}"
            )
    unlisted = sorted(set(holders) - set(listed))
    if unlisted:
        raise ModelLoadError(
            f"model {name!r}: {holders[unlisted[0]][0].name} holds {unlisted[0]!r}"
            + (f" and {len(unlisted) - 1} more tensors" if len(unlisted) > 1 else "")
            + f" that {index.name} does not list; the index and the weights files do not agree: {_FIX}"
        )
    return {key: paths[0] for key, paths in holders.items()}


def header_keys(path: Path, name: str) -> list[str]:
    """The tensor names in ``path``'s header (the file's size checked against it by safetensors)."""
    from safetensors import safe_open

    with reading(path, name), safe_open(str(path), framework="pt") as handle:
        return list(handle.keys())


@contextmanager
def reading(path: Path, name: str) -> Iterator[None]:
    """A weights file read as a named error: missing, or damaged (cut short, a header that is not
    one), never a raw SafetensorError or OSError."""
    from safetensors import SafetensorError

    try:
        yield
    except FileNotFoundError:
        raise ModelLoadError(
            f"model {name!r}: its weights file {path} is missing; download the model again"
        ) from None
    except (SafetensorError, OSError) as exc:  # cut short, a header that is not one, unreadable
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelLoadError(
            f"model {name!r}: its weights file {path} cannot be read ({type(exc).__name__}: {detail}); it "
            f"is damaged or incomplete: {_FIX}"
        ) from None
