"""Settings: how a model is loaded and run, as one frozen value that travels whole.

    settings = Settings(model="SmolLM2.gguf", model_dtype="bfloat16", max_length=64)
    enc = Encoder(settings)                        # or Encoder("SmolLM2.gguf", model_dtype=...)
    enc.settings                                   # what it was made with (model: its name)

Each front end builds one from its options (the CLI's ``extract`` and ``serve``, the HTTP server,
``lw.ray``) and hands it on intact: to Ray actors, to the server's model process, to every output's
metadata and to the store's resume check. None of them rebuilds an Encoder from a subset of its
settings, so an option cannot be dropped on one path (nanoGPT's one ``GPTConfig`` is the model).
Adding a setting is one edit: a field of :class:`Settings` made with :func:`setting`, whose
metadata is its command-line option everywhere (cli/_options.py reads it); a field that changes the
numbers says ``numbers=True``, and every resume check follows (tests/test_new_setting.py).

What a *run* returns (layers, pooling, fusion, the final norm of a call, long texts) is an
:class:`~layerwise.OutputPlan`; ``final_norm`` here is the default a plan without one gets.
Torch-free: a driver builds and checks settings without loading torch.
"""

from __future__ import annotations

import dataclasses
import typing
import warnings
from dataclasses import InitVar, dataclass, field
from typing import Any, Literal, get_args

from ..errors import OptionError, check_choice
from .placement import device_map_text, device_map_value, memory_caps

ModelDtype = Literal["float32", "float16", "bfloat16"]
MODEL_DTYPES: tuple[str, ...] = get_args(ModelDtype)
FinalNorm = bool | Literal["all"]
FINAL_NORMS: tuple[Any, ...] = (True, False, "all")
# its spelling on the command line and in a query string: last (True), none (False), all
FinalNormName = Literal["last", "none", "all"]
Method = Literal["hidden_states", "hooks"]
METHODS: tuple[str, ...] = get_args(Method)
Quantize = Literal["none", "8bit", "4bit"]


def check_final_norm(value: object, *, optional: bool = False) -> None:
    """``final_norm`` is True, False or "all" (None where a default applies)."""
    if value is None and optional:
        return
    # True == 1 in Python: compare identities so that final_norm=1 is refused, not taken as True
    if not any(value is choice or (isinstance(value, str) and value == choice) for choice in FINAL_NORMS):
        raise OptionError(
            f"final_norm={value!r} is not valid; choose True (the last hidden state after the decoder's "
            "final norm, as transformers returns it), False (every state raw) or 'all' (every state normed)"
        )


def parse_final_norm(text: str) -> FinalNorm:
    """The CLI's and a query string's spelling: ``last`` (True), ``none`` (False) or ``all``."""
    spelled = {"last": True, "true": True, "none": False, "false": False, "all": "all"}
    value = spelled.get(str(text).strip().lower())
    if value is None:
        raise OptionError(f"--final-norm {text!r} is not valid; choose {', '.join(get_args(FinalNormName))}")
    return value  # type: ignore[return-value]


def final_norm_name(value: FinalNorm | None) -> FinalNormName | None:
    """The CLI's spelling of a final_norm value (for messages and ``layerwise info``)."""
    if value is None:
        return None
    return "all" if value == "all" else ("last" if value else "none")


def _whole(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(
            f"{name}={value!r} must be a whole number >= 1" + (" (or None)" if optional else "")
        )


# Field metadata of a setting (or an OutputPlan entry) that changes the numbers a run makes: runs
# that differ in it must not resume one another. ``recorded_as``: its key in the run's metadata.
NUMBERS: dict[str, Any] = {"numbers": True}


def numbers_keys(cls: type) -> tuple[str, ...]:
    """The metadata keys of ``cls``' fields (Settings, OutputPlan) that change the numbers: the
    resume checks of the store, the sharded store and the cache are made of them, so a new field
    marked :data:`NUMBERS` is checked there with no list to edit."""
    return tuple(
        f.metadata.get("recorded_as", f.name) for f in dataclasses.fields(cls) if f.metadata.get("numbers")
    )


def setting(
    default: Any,
    help: str,
    *,
    numbers: bool = False,
    flags: tuple[str, ...] = (),
    whole: bool = False,
    cli: tuple[Any, Any] | None = None,
) -> Any:
    """A field of :class:`Settings`, and everything a front end needs to offer it: ``help`` (the
    command line's help, the option's one line), ``numbers`` (it changes the numbers: the resume
    checks compare it, :data:`NUMBERS`), ``flags`` (the option's spellings, else ``--field-name``),
    ``whole`` (a whole number >= 1, or None: checked here, ``min=1`` on the command line), ``cli``
    (``(type, to_value)`` where the command line spells it otherwise than Python: its type there,
    and the function from that spelling to the value). The field's type, default and choices (a
    Literal's values) are the option's."""
    metadata = {"help": help, "flags": flags, "whole": whole, "cli": cli, **(NUMBERS if numbers else {})}
    return field(default=default, metadata=metadata)


def final_norm_value(choice: FinalNormName | None) -> FinalNorm:
    """The Python value of --final-norm: True (last), False (none) or "all"; not given (None):
    True, the final norm on the last hidden state, as transformers returns it."""
    return True if choice is None else parse_final_norm(choice)


FINAL_NORM_HELP = (
    "Decoder LMs: the final norm on the last hidden state (last, as transformers returns it), on none "
    "(the raw residual stream), or on all (layers compare on one scale) [default: {}]; encoders have none"
)


@dataclass(frozen=True)
class Settings:
    """How a model is loaded and run. Adding a setting is adding a field here with :func:`setting`:
    every command that loads a model offers it (cli/_options.py reads the fields), the Encoder and
    the engine receive it whole, every output's metadata records it (``read_meta``), and a field
    marked ``numbers=True`` joins the resume checks (tests/test_new_setting.py makes that one edit).

    Args:
        model: a hub name, a folder, a GGUF file, or None for the packaged all-MiniLM-L6-v2.
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:1"``…
        model_dtype: the model's weights and compute dtype; results are always float32.
        max_length: tokens per input with special tokens; None: the model's (ST max_seq_length).
        batch_size: at most this many inputs per forward pass; None: 128 on CPU, 1024 on GPU
            (benchmarks/gpu_profile.py: short sentences fill an H100 only past 128 a batch).
        max_tokens: tokens per forward pass (real ones when packed, else inputs x longest input);
            None: 2048 on CPU (benchmarks/token_budget.py), 32768 on GPU.
        packed: the unpadded forward where the architecture allows it (same numbers).
        concurrent_forwards: packed batches run side by side on the CPU, each on its share of the
            threads; None: 2 for a model up to 512 wide on 2+ threads, else 1. (``streams``, its
            earlier name, is a deprecated alias for one release: it warns and sets this.)
        allow_nan: keep NaN/inf hidden states (with a warning); else a NonFiniteError names the input.
        final_norm: a decoder's final norm on the last hidden state (True), on none (False) or on
            every one ("all"): the default of every call that does not say (OutputPlan.final_norm).
        method: ``output_hidden_states`` or forward hooks (the same numbers): the default of calls.
        streaming: run the model layer by layer over blocks of texts, each layer's weights read once
            per block from the memory-mapped checkpoint: models larger than memory
            (_model/streaming/forward.py); None: when the weights do not fit in the device's free
            memory (_model/streaming/fits.py).
        max_device_memory: a streamed model's memory budget ("4GB"): the block size follows from it;
            with a device map, each GPU's cap ("20GB") or each device's ("0=20GB,1=20GB,cpu=64GB").
        stream_block_tokens: tokens per streamed block; None: what the budget holds, else 32768.
        device_map: spread the model over devices with accelerate, as transformers does: "auto",
            "balanced", "sequential", or a map of module names to devices (a dict, its JSON, or a
            .json file; "disk" offloads). The model then runs transformers' own forward
            (_model/loading/placement.py).
        offload_folder: where a device map's "disk" weights go when the checkpoint cannot be
            memory-mapped in place; None: a temporary folder, removed with the model.
        quantize: 8- or 4-bit weights through bitsandbytes (CUDA only; the ``quantize`` extra).
        trust_remote_code: run a model's own code (its config's ``auto_map``: a Python file in its
            folder or Hub repository), as transformers' argument of that name. Never on by default:
            that code runs with your permissions.
    """

    # the model changes the numbers too: the resume checks compare its weights' hash
    model: str | None = setting(
        None,
        "Hugging Face name or local folder [default: packaged all-MiniLM-L6-v2]",
        flags=("--model", "-m"),
    )
    device: str = setting("auto", "auto | cpu | cuda | cuda:N")
    model_dtype: ModelDtype = setting("float32", "Compute dtype of the model", numbers=True)
    max_length: int | None = setting(
        None, "Tokens per input [default: model maximum]", numbers=True, whole=True
    )
    batch_size: int | None = setting(
        None,
        "Most inputs per forward pass [default: 128 on CPU, 1024 on GPU]",
        flags=("--batch-size", "-b"),
        whole=True,
    )
    max_tokens: int | None = setting(
        None,
        "Most tokens per forward pass (padded ones with --no-packed) [default: 2048 on CPU, 32768 on GPU]",
        whole=True,
    )
    packed: bool = setting(True, "Unpadded forward where the architecture allows it (same numbers)")
    concurrent_forwards: int | None = setting(
        None,
        "Packed batches run side by side on the CPU [default: 2 for models up to 512 wide, 2+ cores]",
        whole=True,
    )
    allow_nan: bool = setting(
        False, "Keep NaN/inf hidden states (with a warning) instead of stopping", flags=("--allow-nan",)
    )
    final_norm: FinalNorm = setting(
        True, FINAL_NORM_HELP, numbers=True, cli=(FinalNormName | None, final_norm_value)
    )
    method: Method = setting("hidden_states", "output_hidden_states or forward hooks (the same numbers)")
    streaming: bool | None = setting(
        None,
        "Layer-streamed forward for models larger than memory: each layer's weights read once per "
        "block of texts (same numbers) [default: when the weights do not fit in the device's free memory]",
    )
    max_device_memory: str | None = setting(
        None,
        "A streamed model's memory for weights and activations, e.g. 4GB: sets the block size",
    )
    stream_block_tokens: int | None = setting(
        None, "Tokens per streamed block [default: what --max-device-memory holds, else 32768]", whole=True
    )
    device_map: str | None = setting(
        None,
        "Spread the model over devices (accelerate): auto, balanced, sequential, or a JSON map / .json "
        "file of module names to devices (0, cuda:1, cpu, disk)",
    )
    offload_folder: str | None = setting(
        None, "Where a device map's disk weights are written if needed [default: a temporary folder]"
    )
    quantize: Quantize = setting("none", "8- or 4-bit weights with bitsandbytes (CUDA only)", numbers=True)
    trust_remote_code: bool = setting(
        False,
        "Run the model's own Python code from its folder or the Hub (auto_map in config.json); only for "
        "code you trust",
        flags=("--trust-remote-code",),
    )
    # the earlier name of concurrent_forwards: accepted with a warning for one release (not a field: not
    # an option of its own, not recorded)
    streams: InitVar[int | None] = None

    def __post_init__(self, streams: int | None) -> None:
        if streams is not None:
            self._take_streams(streams)
        for name in ("model", "offload_folder"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                object.__setattr__(self, name, str(getattr(self, name)))  # a Path: kept as its string
        if not isinstance(self.device, str):
            object.__setattr__(self, "device", str(self.device))  # a torch.device
        object.__setattr__(self, "device_map", device_map_text(self.device_map))  # a dict: its JSON
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("whole"):
                _whole(f.name, value, optional=True)
            elif hints[f.name] == bool | None and not isinstance(value, bool | None):
                raise OptionError(f"{f.name}={value!r} must be True, False or None")
            elif hints[f.name] is bool and not isinstance(value, bool):
                raise OptionError(f"{f.name}={value!r} must be True or False")
            elif typing.get_origin(hints[f.name]) is Literal:
                check_choice(f.name, value, get_args(hints[f.name]))
        check_final_norm(self.final_norm)
        self._check_placement()

    def _check_placement(self) -> None:
        caps = None if self.max_device_memory is None else memory_caps(self.max_device_memory)
        if self.device_map is not None:
            device_map_value(self.device_map)
        if self.streaming and not self.packed:
            raise OptionError("streaming=True runs the packed forward layer by layer: leave packed=True")
        if self.streaming and (self.device_map is not None or self.quantize != "none"):
            given = "device_map" if self.device_map is not None else f"quantize={self.quantize!r}"
            raise OptionError(
                f"streaming=True and {given} are two ways to hold a model larger than a device: pick one "
                "(streaming reads each layer once per block of texts; a device map spreads the layers)"
            )
        if isinstance(caps, dict) and self.device_map is None:
            raise OptionError(
                f"max_device_memory={self.max_device_memory!r} caps device by device, which only a "
                "device map uses; a streamed model takes one size (e.g. 4GB)"
            )

    def _take_streams(self, streams: int) -> None:
        """The deprecated ``streams=`` (the earlier name of ``concurrent_forwards``): warn, and set it."""
        warnings.warn(
            f"streams={streams!r} is deprecated and goes in the next release: use "
            f"concurrent_forwards={streams!r} (CLI: --concurrent-forwards); 'streaming' is layer "
            "streaming of weights, a different thing",
            FutureWarning,
            stacklevel=4,
        )
        if self.concurrent_forwards is not None and self.concurrent_forwards != streams:
            raise OptionError(
                f"streams={streams!r} and concurrent_forwards={self.concurrent_forwards!r} are one setting "
                "(streams is its deprecated name): give concurrent_forwards only"
            )
        object.__setattr__(self, "concurrent_forwards", streams)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (checked like the original)."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """Every field under its Python name (JSON-ready: strings, numbers, booleans, None)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Settings:
        """Settings from :meth:`as_dict` (fields it does not know are refused, naming them)."""
        known = {f.name for f in dataclasses.fields(cls)}
        if "streams" in values:  # a record made before the rename: the earlier name of concurrent_forwards
            values = {("concurrent_forwards" if k == "streams" else k): v for k, v in values.items()}
        unknown = sorted(set(values) - known)
        if unknown:
            raise OptionError(f"unknown settings {unknown}; known: {sorted(known)}")
        return cls(**values)


def as_settings(value: object) -> Settings:
    """``value`` itself where it is a Settings (``Encoder.from_settings`` takes nothing else)."""
    if not isinstance(value, Settings):
        raise OptionError(f"settings must be a layerwise.Settings, not {type(value).__name__}")
    return value


def settings_of(model: Any, options: dict[str, Any]) -> Settings:
    """The Settings of ``Encoder(model, **options)``: ``model`` a Settings (``options`` replace its
    fields) or the model's name (``options`` are the other fields). An unknown keyword names the
    known ones."""
    names = [f.name for f in dataclasses.fields(Settings)]
    unknown = sorted(set(options) - {*names, "streams"})  # streams: the deprecated concurrent_forwards
    if unknown or "model" in options:
        raise OptionError(
            f"Encoder() got unknown options {unknown or ['model']}: it takes a layerwise.Settings or the "
            f"model, then {', '.join(f for f in names if f != 'model')} (layerwise.Settings documents each)"
        )
    if isinstance(model, Settings):
        return model.replace(**options) if options else model
    return Settings(None if model is None else str(model), **options)
