"""What ``verify`` found about a store (or, through its subclass, a cache): OK, INCOMPLETE (fewer
texts committed than the store was started for) or DAMAGED, with the problems and the texts hit."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class VerifyReport:
    """What :func:`verify_store` found. ``ok`` when ``problems`` is empty."""

    path: Path
    n_texts: int
    n_rows: int
    problems: list[str] = field(default_factory=list)
    text_ids: list[int] = field(default_factory=list)
    checksums: bool = True
    n_expected: int = 0  # the texts the store was started for (its metadata); 0: not recorded

    @property
    def incomplete(self) -> bool:
        """Undamaged, but fewer texts are committed than the store was started for."""
        return not self.problems and self.n_texts < self.n_expected

    @property
    def ok(self) -> bool:
        return not self.problems and not self.incomplete

    def __str__(self) -> str:
        what = "rows, offsets, manifest, shards" + (" and checksums" if self.checksums else "")
        if self.incomplete:
            return (
                f"{self.path}: INCOMPLETE: {self.n_texts} of the {self.n_expected} texts it was started "
                f"for are committed ({self.n_rows} rows; their {what} agree). Its write stopped early: "
                "run the same extract again (it resumes where it stopped) to add the rest"
            )
        if self.ok:
            return f"{self.path}: OK: {self.n_texts} texts, {self.n_rows} rows; {what} agree"
        lines = [f"{self.path}: DAMAGED ({len(self.problems)} problem(s))"]
        lines += [f"  - {p}" for p in self.problems]
        if self.text_ids:
            shown = ", ".join(map(str, self.text_ids[:20])) + (" …" if len(self.text_ids) > 20 else "")
            lines.append(f"  texts affected ({len(self.text_ids)}): {shown}")
        return "\n".join(lines)
