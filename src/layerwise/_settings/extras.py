"""The optional extras, and which options need which: a command checks what its options need before
it loads a model or reads a corpus, so that a missing extra fails in the first second with the
command that installs it, not after a model has loaded or a probe has run for minutes."""

from __future__ import annotations

from pathlib import Path

from ..errors import require_extra

# extra -> (the modules it brings that the work imports, what needs them): pyproject.toml's extras
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "store": (("zarr", "pyarrow"), "the store"),
    "io": (("pyarrow",), "Parquet"),
    "cache": (("datasets", "pyarrow"), "the activation cache"),
    "probe": (("sklearn", "scipy"), "probing"),
    "plot": (("matplotlib",), "plots"),
    "serve": (("fastapi", "uvicorn"), "the service"),
    "distributed": (("ray", "zarr", "pyarrow"), "--ray"),
    "vision": (("PIL",), "image models"),
    "audio": (("soundfile", "scipy"), "speech models"),
}
# the suffixes of files whose reading or writing needs pyarrow
_TABLES = (".parquet", ".csv")


def require(extra: str, what: str | None = None) -> None:
    """Raise MissingDependencyError naming the pip command when ``extra``'s modules are missing
    (``what``: the option that needs it, "--plot"; default: the extra's own work)."""
    modules, work = EXTRAS[extra]
    require_extra(modules, what or work, extra)


def require_for_files(paths: list[Path] | tuple[Path, ...], option: str) -> None:
    """The ``io`` extra where one of ``paths`` (an output, or a corpus's files) is read or written
    as Parquet or CSV; ``option`` names them in the message ("-o", "the corpus")."""
    tables = [p for p in paths if any(s.lower() in _TABLES for s in p.suffixes)]
    if tables:
        require("io", f"{option} {str(tables[0])!r}")
