"""What the driver does: check the settings and the plan against the model, cut the corpus into
shards, hand them to the actors (``_actors.py``) and sum up what they wrote."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._features.plan import OutputPlan
from .._settings.settings import Settings
from ..errors import OptionError
from ..store._format import StoreLayout
from ._actors import EmbedActor, ShardWriter
from ._runtime import import_ray

logger = logging.getLogger("layerwise")

MAX_SHARD_SIZE = 4096
# the sizes :func:`auto_shard_size` picks for a corpus of workers x 1,024 texts or more: the driver
# hashes every one of them in its one pass over the corpus, before it knows the count
PLANNED_SIZES = (1024, 2048, 3072, 4096)


def auto_shard_size(n_texts: int, workers: int = 1) -> int:
    """About 32 shards (enough to balance a few actors), each 1,024..4,096 texts, a multiple of
    1,024 (smaller shards cost more: 256-text shards +11% over one store, 1,024-text +3%,
    docs/guide/ray.md); a corpus too small for that is cut into one shard per worker, so that
    every actor has work. A rerun that leaves the size to this function keeps the size the store
    was started with (begin_sharded_store), whatever its --workers."""
    per_worker = -(-n_texts // max(1, workers))
    if per_worker < 1024:
        return max(1, per_worker)
    thirty_second = -(-n_texts // 32)
    return min(MAX_SHARD_SIZE, max(1024, -(-thirty_second // 1024) * 1024))


def _resumed_shard_size(path: Path, overwrite: bool) -> int | None:
    """The shard size of the sharded store a rerun resumes (None: a new one)."""
    from ..store._shard_table import is_sharded, read_table

    if overwrite or not is_sharded(path):
        return None
    return read_table(path).get("shard_size")


def _texts_of(data: Any, column: str) -> list[str]:
    """A list of strings as it is, or a Ray Dataset's ``column`` in dataset order."""
    if isinstance(data, list | tuple):
        return list(data)
    ray = import_ray()
    if isinstance(data, ray.data.Dataset):
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True
        return [str(row[column]) for row in data.select_columns([column]).iter_rows()]
    raise OptionError(f"data must be a list of texts or a ray.data.Dataset, not {type(data).__name__}")


def _checked(settings: Settings, plan: OutputPlan) -> tuple[Settings, OutputPlan, str, int]:
    """The actors' settings (the model as its resolved source, "auto" devices as cpu) and the plan
    with its final norm settled, checked against the model's config before any actor starts: a bad
    layer spec or a final norm on an encoder fails here, not in every actor. Also the model's name
    (for the store's table) and its number of hidden states."""
    from transformers import AutoConfig

    from .._features.plan import check_final_norm_for
    from .._model.families.media import modality_of_source
    from .._model.final_norm import config_has_final_norm
    from .._model.loading.gguf_files import loader_args
    from .._model.loading.source import resolve_model_source

    if not isinstance(settings, Settings):
        raise OptionError(f"settings must be a layerwise.Settings, not {type(settings).__name__}")
    if not isinstance(plan, OutputPlan):
        raise OptionError(f"plan must be a layerwise.OutputPlan, not {type(plan).__name__}")
    if settings.quantize != "none" and not settings.device.startswith("cuda"):
        raise OptionError(
            f"quantize={settings.quantize!r} runs bitsandbytes' CUDA kernels, and Ray's actors run on the "
            "CPU unless device='cuda' (one GPU each): pass device='cuda' (--device cuda)"
        )
    if settings.model is not None and Path(settings.model).expanduser().exists():
        # a local folder or file: by its absolute path, wherever an actor's working folder is
        settings = settings.replace(model=str(Path(settings.model).expanduser().resolve()))
    source, name = resolve_model_source(settings.model)  # name: what each actor's Encoder says
    if modality_of_source(source) != "text":
        return (settings, *_checked_media(settings, plan, source, name))
    where, gguf = loader_args(source)
    remote = {"trust_remote_code": True} if settings.trust_remote_code else {}
    config = AutoConfig.from_pretrained(where, **gguf, **remote)
    n_hidden = int(config.num_hidden_layers) + 1
    plan.hidden_states(n_hidden)
    takes = config_has_final_norm(config)
    described = f"{name!r} (a {config.model_type!r} model)"
    check_final_norm_for(settings.final_norm, takes=takes, name=described)  # the Encoders' default
    plan = plan.with_final_norm(settings.final_norm, takes=takes, name=described)
    return settings, plan, name, n_hidden


def _checked_media(
    settings: Settings, plan: OutputPlan, source: str, name: str
) -> tuple[OutputPlan, str, int]:
    """An image or a speech model's plan, settled as its Encoder settles it (a whole CLIP or SigLIP:
    its vision tower's config), its name and its number of hidden states."""
    from transformers import AutoConfig

    from .._encoder.media import settle_media_plan
    from .._model.families.media import TOWERS, media_family

    config = AutoConfig.from_pretrained(source)
    tower = config.vision_config if config.model_type in TOWERS else config
    family = media_family(config.model_type)
    n_hidden = int(getattr(tower, "encoder_layers", None) or tower.num_hidden_layers) + 1
    model_type = str(tower.model_type)
    return settle_media_plan(plan, family, name, model_type, n_hidden, settings.final_norm), name, n_hidden


def embed(
    ds: Any,
    settings: Settings | None = None,
    plan: OutputPlan | None = None,
    *,
    column: str = "text",
    output_column: str = "embedding",
    workers: int = 2,
    threads_per_worker: int = 1,
    batch_size: int = 256,
) -> Any:
    """``ds`` with one more column, ``output_column``: each text's pooled (and fused) vector, as
    ``Encoder.from_settings(settings).embed`` computes it (``plan``: sentence pooling only, default
    the last layer's mean; token and word vectors go to a store: :func:`extract_to_store`).
    ``settings``: the model and how it runs (default: the packaged model)."""
    ray = import_ray()
    settings = Settings() if settings is None else settings
    plan = OutputPlan.parse(layers=-1, pool="sentence:mean") if plan is None else plan
    if plan.level != "sentence":
        raise OptionError(
            f"pool={plan.pool!r}: lw.ray.embed returns one vector per text (sentence:MODE); token and word "
            "vectors are too large for dataset columns: use lw.ray.extract_to_store"
        )
    settings, plan, _, _ = _checked(settings, plan)
    return ds.map_batches(
        EmbedActor,
        batch_size=batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=workers),
        fn_constructor_args=(settings, threads_per_worker, plan, column, output_column),
        num_cpus=threads_per_worker,
        num_gpus=1 if settings.device.startswith("cuda") else 0,
    )


@dataclass
class ShardedSummary:
    path: Path
    n_texts: int
    n_shards: int
    n_shards_skipped: int  # already complete when the run started (a resumed run)
    n_written: int
    n_rows: int
    seconds: float
    plan_seconds: float = 0.0  # the driver's: its pass over the corpus and the table, before any actor
    n_truncated: int = 0  # texts of this run longer than the model's max length (cut, or windowed)


def extract_to_store(
    settings: Settings,
    corpus: Any,
    path: str | os.PathLike,
    plan: OutputPlan | None = None,
    *,
    layout: StoreLayout | None = None,
    column: str = "text",
    workers: int = 2,
    threads_per_worker: int = 1,
    shard_size: int | None = None,
    overwrite: bool = False,
    writer: type = ShardWriter,
) -> ShardedSummary:
    """Extract ``corpus`` with the model ``settings`` describe into a sharded store at ``path``, as
    ``lw.extract_to_store(Encoder.from_settings(settings), corpus, path, plan)`` would in one
    process: shards of ``shard_size`` consecutive texts (default :func:`auto_shard_size`), each
    written by one actor that loads the model from ``settings``, whole. Rerun the same call to
    resume. ``layout``: each shard's :class:`~layerwise.StoreLayout` (the store's).

    ``corpus`` is a :class:`~layerwise.Corpus` (from files, or ``Corpus.from_inputs(texts,
    text_pairs=…)``) or a path (read with ``column`` as its text column): the driver reads it once,
    without holding it, to plan the shards (each one's first row and the hash of its texts), and
    each actor reads its own shard's rows; or a list of texts, or a Ray Dataset's ``column``
    (collected on the driver). ``writer`` is the actor class (tests pass one that dies mid-shard)."""
    from ..store._shard_writer import begin_sharded_store

    plan = OutputPlan(dtype="float16") if plan is None else plan
    layout = StoreLayout() if layout is None else layout
    if not isinstance(layout, StoreLayout):
        raise OptionError(f"layout must be a layerwise.StoreLayout, not {type(layout).__name__}")
    ray = import_ray()
    started = time.perf_counter()  # the plan's time: the corpus' one pass, the shard table
    corpus, texts, n_texts = _read_for_planning(corpus, column, Path(path), shard_size, overwrite)
    settings, plan, name, n_hidden = _checked(settings, plan)
    path = Path(path)
    table = begin_sharded_store(
        path,
        model=name,
        plan=plan,
        n_hidden_states=n_hidden,
        texts=corpus or texts,
        text_pairs=None,
        shard_size=shard_size,
        auto_shard_size=auto_shard_size(n_texts, workers),
        settings=settings,
        layout=dataclasses.asdict(layout),
        overwrite=overwrite,
        run={
            "workers": workers,
            "threads_per_worker": threads_per_worker,
            "source": corpus.describe() if corpus is not None else "memory",
        },
    )
    ranges = [(shard["start"], shard["stop"]) for shard in table["shards"]]
    plan_seconds = time.perf_counter() - started

    from ..store._sharded import shard_progress

    todo = set(shard_progress(path).pending)  # a resumed run skips complete shards
    rows = [
        {"shard": k}
        if corpus is not None  # the actors read their own rows
        else {"shard": k, "texts": texts[a:b], "text_pairs": []}  # pairs come in a Corpus
        for k, (a, b) in enumerate(ranges)
        if k in todo
    ]
    constructor = (settings, threads_per_worker, plan, str(path), table, layout, corpus)
    gpus = 1 if settings.device.startswith("cuda") else 0  # one GPU per actor
    written = _write_shards(ray, writer, rows, constructor, workers, threads_per_worker, gpus) if rows else []
    return _summary(path, written, n_texts, len(ranges), len(ranges) - len(rows), started, plan_seconds)


def _summary(
    path: Path,
    written: list[dict],
    n_texts: int,
    n_shards: int,
    n_skipped: int,
    started: float,
    plan_seconds: float,
) -> ShardedSummary:
    """The run's summary, once every shard is complete (a shard left pending is an error naming the
    fix); the texts truncated in every shard said once, as one process says them (store/_writer.py)."""
    from ..store._sharded import shard_progress

    progress = shard_progress(path)  # not ShardedStore(path): that reads every manifest
    if progress.pending:
        raise RuntimeError(f"{path}: {progress.n_texts} of {n_texts} texts after the run; rerun to finish")
    truncated = sum(int(r.get("n_truncated", 0)) for r in written)
    n_written = sum(int(r["n_written"]) for r in written)
    if truncated:
        logger.warning(
            "%d of %d texts were longer than the model's max length and were truncated; the manifest's "
            "'truncated' column marks them. Pass long_texts='window' to keep every token.",
            truncated,
            n_written,
        )
    return ShardedSummary(
        path=path,
        n_texts=n_texts,
        n_shards=n_shards,
        n_shards_skipped=n_skipped,
        n_written=n_written,
        n_rows=progress.n_rows,
        seconds=time.perf_counter() - started,
        plan_seconds=plan_seconds,
        n_truncated=truncated,
    )


def _read_for_planning(
    data: Any, column: str, path: Path, shard_size: int | None, overwrite: bool
) -> tuple[Any, list[str], int]:
    """``(corpus, texts, n_texts)``: a Corpus (a path read with ``column``) read once to plan the
    shards, with no texts held; or the texts of a list or a Ray Dataset's ``column``, held."""
    from .._inputs.corpus import Corpus

    if isinstance(data, str | os.PathLike):
        data = Corpus(data, text_column=None if column == "text" else column)
    if not isinstance(data, Corpus):
        texts = _texts_of(data, column)
        return None, texts, len(texts)
    # one streamed pass: rows checked and counted, nothing held, each shard's texts hashed for
    # every size the plan may pick (the store's own when resuming), its first row recorded
    sizes = shard_size or (_resumed_shard_size(path, overwrite) or PLANNED_SIZES)
    return data, [], data.scan(ranges=sizes).n_texts


def _write_shards(
    ray: Any,
    writer: type,
    rows: list[dict],
    constructor: tuple,
    workers: int,
    threads_per_worker: int,
    gpus: int,
) -> list[dict]:
    """Each row's shard written by one of ``workers`` actors of ``writer(*constructor)``, each with
    ``threads_per_worker`` CPUs and ``gpus`` GPUs; their small result rows back."""
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # redrawing them costs the driver a core on a small machine
    shards = ray.data.from_items(rows, override_num_blocks=len(rows))
    return shards.map_batches(
        writer,
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=min(workers, len(rows))),
        fn_constructor_args=constructor,
        num_cpus=threads_per_worker,
        num_gpus=gpus,
        # a dead actor is restarted and its shard retried (Ray Data's own default for actor pools,
        # max_restarts=-1 and max_task_retries=-1: passing them is deprecated, RayDeprecationWarning):
        # the shard resumes from its last commit (tests/test_ray.py kills an actor mid-shard)
    ).take_all()
