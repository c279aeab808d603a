"""Every exception layerwise raises on purpose.

    LayerwiseError                      base class: catch this to catch them all
    ├── LayerSpecError (ValueError)     a layer spec that does not parse or is out of range
    ├── InputError (ValueError)         a text, pair, word list or input file line that cannot be used
    │   └── InputTooLargeError          an input or request over a size limit (HTTP 413)
    ├── OptionError (ValueError)        an argument outside its valid choices (batch size, dtype, tap name…)
    ├── ModelLoadError (OSError)        a model or tokenizer that cannot be found or loaded
    ├── NonFiniteError (ArithmeticError) the model produced NaN or inf for an input (allow_nan keeps them)
    ├── StoreError (OSError)            a store that cannot be written: locked, incompatible, disk failed
    │   ├── NotAStoreError              the path is not a layerwise store (on read and on write)
    │   └── StoreDamagedError           a store whose files contradict each other; says what and where
    └── MissingDependencyError (ImportError)
                                        an optional extra is not installed; the message says which

Each message names the bad value and says how to fix it. The built-in base classes are kept so that
code written against ``ValueError`` or ``OSError`` keeps working.
"""

from __future__ import annotations


class LayerwiseError(Exception):
    """Base class of all layerwise errors.

    Every one survives a pickle round trip with its attributes (the server's model process and Ray
    actors send them across processes): keyword-only ``__init__`` arguments are restored from the
    instance's ``__dict__``, not passed positionally as ``BaseException`` would."""

    def __reduce__(self):
        return _rebuild, (type(self), self.args, dict(self.__dict__))


class LayerSpecError(LayerwiseError, ValueError):
    """A layer spec that does not parse, or names a hidden state the model does not have."""


class InputError(LayerwiseError, ValueError):
    """Input that cannot be encoded. ``index`` is the 0-based item, ``line`` the 1-based file line."""

    def __init__(self, message: str, *, index: int | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.line = line


class InputTooLargeError(InputError):
    """An input, or a request, over a size limit: split it, or ask for less."""


class OptionError(LayerwiseError, ValueError):
    """An argument outside its valid choices."""


class ModelLoadError(LayerwiseError, OSError):
    """A model or tokenizer that cannot be found or loaded."""


class NonFiniteError(LayerwiseError, ArithmeticError):
    """The model produced NaN or inf in a hidden state (float16 overflow, or broken weights).
    ``index`` is the input, ``layer`` the first hidden state that holds one."""

    def __init__(self, message: str, *, index: int, layer: int) -> None:
        super().__init__(message)
        self.index = index
        self.layer = layer


class OutputError(LayerwiseError, OSError):
    """An output file cannot be written (disk full, quota, I/O error); nothing was left behind."""


class StoreError(LayerwiseError, OSError):
    """A store cannot be written or read: locked by another writer, incompatible, or the disk failed."""


class NotAStoreError(StoreError):
    """The path is not a layerwise store (and will not be written over)."""


class StoreDamagedError(StoreError):
    """A store whose parts contradict each other (a missing shard, a manifest that does not match the
    offsets, a checksum that differs). ``problems`` lists what is wrong; ``text_ids`` the texts hit,
    when they are known."""

    def __init__(self, message: str, *, problems: list[str] | None = None, text_ids: list[int] | None = None):
        super().__init__(message)
        self.problems = problems or [message]
        self.text_ids = text_ids or []


class MissingDependencyError(LayerwiseError, ImportError):
    """An optional dependency is missing; the message carries the pip command that installs it."""


def _rebuild(cls: type[BaseException], args: tuple, state: dict) -> BaseException:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """Raise OptionError unless ``value`` is one of ``choices`` (the Literal modes of the public API)."""
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise OptionError(f"{name}={value!r} is not valid; choose one of {listed}")


def import_optional(module: str, what: str) -> object | None:
    """``module`` imported, or None when it is not installed. One that is installed but fails to
    import (a numpy it was not built for, a missing library) raises MissingDependencyError in one
    line naming the cause; what its import printed on the way (numpy prints a page) is kept back."""
    import contextlib
    import importlib
    import io

    noise = io.StringIO()
    try:
        with contextlib.redirect_stderr(noise):
            return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module or (exc.name or "").startswith(module + "."):
            return None
        cause: BaseException = exc
    except Exception as exc:  # ImportError, AttributeError (_ARRAY_API), ValueError (dtype size)
        cause = exc
    first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    raise MissingDependencyError(
        f"{what} needs {module}, which is installed but fails to import ({type(cause).__name__}: "
        f"{first}); reinstall it for this Python and numpy: pip install --force-reinstall {module}"
    ) from None


def require_extra(modules: tuple[str, ...], what: str, extra: str) -> None:
    """Raise MissingDependencyError naming the ``modules`` of an extra that are not installed and
    the command that installs them (``what``: "the store", "the activation cache"), or the one
    that is installed but cannot be imported, and why."""
    missing = [module for module in modules if import_optional(module, what) is None]
    if missing:
        packages = [_PACKAGES.get(module, module) for module in missing]
        raise MissingDependencyError(
            f"{what} needs {' and '.join(packages)}: pip install 'layerwise[{extra}]' "
            f"(or pip install {' '.join(packages)})"
        )


_PACKAGES = {"sklearn": "scikit-learn"}  # the pip name of a module named otherwise
