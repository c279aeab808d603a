"""What happens to an input longer than the model's maximum: it is truncated, or read in sliding
windows of ``stride`` tokens' step (_inputs/windows.py). A plan's option and a server's default:
one rule for both."""

from __future__ import annotations

from typing import Literal, get_args

from ..errors import OptionError, check_choice

LongTexts = Literal["truncate", "window"]
LONG_TEXTS: tuple[str, ...] = get_args(LongTexts)


def check_long_texts(long_texts: object, stride: object) -> None:
    """``long_texts`` is one of LONG_TEXTS, and ``stride`` (a window's step) is None or a whole
    number >= 1 that comes with windows."""
    check_choice("long_texts", long_texts, LONG_TEXTS)
    if stride is None:
        return
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise OptionError(f"stride={stride!r} must be a whole number >= 1 (or None)")
    if long_texts != "window":
        raise OptionError(
            f"stride={stride} applies to sliding windows only; pass long_texts='window' "
            "(--long-texts window) too or drop stride"
        )
