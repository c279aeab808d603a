"""``layerwise cache``: token activations of several layers for SAE and probe training, in a
shuffled, resumable ``datasets`` folder (layerwise/_cache)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated

import typer

from .._settings.settings import Settings
from ..errors import OptionError
from ._groups import NO_RAY, InputFormatOption, RayOptions, TextColumnOption, ray_options
from ._options import MODEL_SETTINGS, EncodingErrorsOption, model_options
from ._shared import app, err, setup_logging, use_available_cores

_SCALE = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9}


MAX_COUNT = 10**15  # a thousand trillion tokens: more than any corpus


def parse_count(value: str, option: str) -> int:
    """A count written ``1000000``, ``1_000_000``, ``1e6``, ``500K``, ``10M`` or ``1G``."""
    text = value.strip().replace("_", "").upper()
    match = re.fullmatch(r"(\d+(?:\.\d+)?(?:E\d+)?)([KMGB]?)", text)
    if match is None:
        raise OptionError(f"{option} {value!r} is not a count: write e.g. 1000000, 1e6, 500K, 10M or 1G")
    count = float(match.group(1)) * _SCALE[match.group(2)]
    if not math.isfinite(count) or count > MAX_COUNT:
        raise OptionError(f"{option} {value!r} is too large: at most {MAX_COUNT:.0e}")
    if count != int(count):
        raise OptionError(f"{option} {value!r} is not a whole number of tokens")
    return int(count)


@app.command()
@model_options(final_norm="none")  # SAELens' default: the raw residual stream
@ray_options(shard_size=False)
def cache(
    input: Annotated[
        str,
        typer.Argument(
            help="Your texts: a corpus as extract reads it (.txt, .jsonl, .csv, .parquet, a glob, -)"
        ),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="The cache folder (a datasets folder)")],
    layers: Annotated[
        str, typer.Option("--layers", "-l", help="Hidden states: 0.25,0.5,0.75 (depths) | 8,15,23 | -1 | all")
    ] = "-1",
    hooks: Annotated[
        str,
        typer.Option(
            help="What to cache of each layer: resid (the residual stream), attn_out, mlp_out (what the "
            "block's attention / feed-forward adds), comma-separated"
        ),
    ] = "resid",
    context: Annotated[int, typer.Option(min=2, help="Tokens per context (one forward sequence each)")] = 128,
    tokens: Annotated[str, typer.Option(help="Tokens to cache: 1000000, 1e6, 500K, 10M")] = "1M",
    dtype: Annotated[str, typer.Option(help="float16 | float32")] = "float16",
    shuffle_seed: Annotated[
        str,
        typer.Option(
            help="Seed of the permutation of contexts over the whole cache; 'none' keeps source order"
        ),
    ] = "0",
    text_column: TextColumnOption = None,
    format: InputFormatOption = None,
    overwrite: Annotated[
        bool, typer.Option(help="Start again: remove what the cache holds (nothing else)")
    ] = False,
    encoding_errors: EncodingErrorsOption = "strict",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar")] = False,
    ray: RayOptions = NO_RAY,  # --ray and its options (@ray_options)
    settings: Settings = MODEL_SETTINGS,  # the model options (@model_options)
) -> None:
    """Cache the activations of several layers from one forward pass per context, for SAE and probe
    training: a shuffled, resumable Hugging Face datasets folder in SAELens' cached-activations
    schema (datasets.load_from_disk opens it). Rerun the same command to resume after a crash."""
    setup_logging(quiet)
    from .._cache import cache_activations
    from .._cache.format import classify, not_a_cache
    from .._cache.options import CacheOptions
    from .._encoder import Encoder
    from .._inputs.corpus import as_corpus
    from .._settings.extras import require

    require("cache")  # before the corpus is read or the model loads
    if ray.mode is not None:
        require("distributed")
    count, seed = parse_count(tokens, "--tokens"), _seed(shuffle_seed)
    if classify(output) == "other":
        raise not_a_cache(output)  # before the model loads
    options = CacheOptions(  # one value, whichever back end runs it; --final-norm: none unless asked
        layers=layers,
        hooks=tuple(h.strip() for h in hooks.split(",")),
        context=context,
        tokens=count,
        dtype=dtype,
        shuffle_seed=seed,
        final_norm=settings.final_norm,
        overwrite=overwrite,
    )
    corpus = as_corpus(input, format=format, text_column=text_column, encoding_errors=encoding_errors)
    use_available_cores()
    err.print(f"loading {settings.model or 'the default model'} …", highlight=False)
    if ray.mode is not None:
        from .. import ray as lw_ray

        workers, threads = ray.sizes()
        lw_ray.init(ray.mode, workers=workers, threads_per_worker=threads)
        summary = lw_ray.cache_activations(
            settings, corpus, output, options, workers=workers, threads_per_worker=threads
        )
    else:
        enc = Encoder.from_settings(settings)
        summary = cache_activations(enc, corpus, output, options, progress=False if quiet else None)
    _report_cache(summary, count, output, quiet)


def _seed(value: str) -> int | None:
    """--shuffle-seed: a whole number, or none (source order)."""
    text = value.strip()
    if text.lower() == "none":
        return None
    if not text.isdigit():
        raise OptionError(
            f"--shuffle-seed {value!r} is not a seed: write a whole number from 0 up (e.g. 0, 42, 1234), "
            "or none to keep the source order"
        )
    return int(text)


def _report_cache(summary, count: int, output: Path, quiet: bool) -> None:
    """What the run wrote (and, always, that the corpus ran out before ``count`` tokens)."""
    if summary.exhausted:
        err.print(
            f"the corpus ended after {summary.n_tokens:,} tokens (asked for {count:,})", highlight=False
        )
    if not quiet:
        err.print(
            f"{output}: {summary.n_contexts:,} contexts x {summary.context} tokens, columns "
            f"{', '.join(summary.columns)}; {summary.n_written} of {summary.n_shards} shards written now "
            f"({summary.seconds:.1f} s)",
            highlight=False,
        )
