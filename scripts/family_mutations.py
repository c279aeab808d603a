"""Put back, one at a time, the nine bugs a mutation audit of the family code found that no test
caught (#81, item 6), and run the tests meant to catch each: every one must fail. The source is
restored after each, whatever happens.

    python scripts/family_mutations.py            # all nine, about 2 minutes
    python scripts/family_mutations.py opt-packed # one, by name
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "layerwise"


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # under src/layerwise
    before: str
    after: str
    tests: str  # a pytest -k expression over tests/test_family_audit.py and the files in ``where``
    where: tuple[str, ...] = ("tests/test_family_audit.py",)


MUTATIONS = (
    Mutation(  # OPT's row says the general path
        "opt-packed",
        "_model/families/table.py",
        '    "opt": _decoder(',
        '    "opt": _general("decoder", "") or _decoder(',
        "packed_family_runs_packed",
    ),
    Mutation(
        "post-norm-taps-swapped",
        "_model/families/table.py",
        '"attn_out": "post_attention_layernorm",\n    "mlp_out": "post_feedforward_layernorm",',
        '"attn_out": "post_feedforward_layernorm",\n    "mlp_out": "post_attention_layernorm",',
        "post_norm",
    ),
    Mutation(
        "metaspace-dropped",
        "_inputs/display.py",
        'if "Metaspace" in kinds or "ByteFallback"',
        'if "ByteFallback"',
        "unigram",
    ),
    Mutation(
        "seal-of-a-non-version",
        "store/_format.py",
        "return len(numbers) < 2 or (",
        "return len(numbers) >= 2 and (",
        "lost_its_seal",
    ),
    Mutation(
        "streaming-threshold",
        "_model/streaming/fits.py",
        "WEIGHTS_SHARE = 0.8",
        "WEIGHTS_SHARE = 0.75",
        "80_percent",
    ),
    Mutation(
        "last-unit-left-out",
        "_model/streaming/model.py",
        "for k in range(len(self.units)))",
        "for k in range(len(self.units) - 1))",
        "one_layer",
    ),
    Mutation(
        "set-aside-field-from-raw",
        "_model/loading/plain.py",
        "for key, value in values.items():\n            if key not in config.__dict__",
        "for key, value in raw.items():\n            if key not in config.__dict__",
        "sets_aside",
    ),
    Mutation(
        "opt-project-in-streams",
        "_model/streaming/support.py",
        'if reason is None and config.model_type == "opt" and projected:',
        'if False and reason is None and config.model_type == "opt" and projected:',
        "opt_350m",
        ("tests/test_family_edges.py",),
    ),
    Mutation(
        "layer-output-check-skipped",
        "_model/forward/padded.py",
        "per_layer = found.layers is not None and all(",
        "per_layer = found.layers is not None or all(",
        "not_its_states",
    ),
)


def run(mutation: Mutation) -> bool:
    """Whether the tests fail with ``mutation`` in place (the source restored after)."""
    path = SRC / mutation.file
    original = path.read_text(encoding="utf-8")
    if original.count(mutation.before) != 1:
        raise SystemExit(f"{mutation.name}: the code it mutates has changed in {path}; update this script")
    try:
        path.write_text(original.replace(mutation.before, mutation.after), encoding="utf-8")
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *mutation.where]
        result = subprocess.run([*command, "-k", mutation.tests], cwd=ROOT, capture_output=True, text=True)
    finally:
        path.write_text(original, encoding="utf-8")
    if result.returncode == 5:  # pytest's "no tests collected"
        raise SystemExit(f"{mutation.name}: -k {mutation.tests!r} selects no test")
    return result.returncode != 0


def main(names: list[str]) -> int:
    chosen = [m for m in MUTATIONS if not names or m.name in names]
    survived = []
    for mutation in chosen:
        caught = run(mutation)
        print(f"{mutation.name:28s} {'caught' if caught else 'SURVIVED'}", flush=True)
        if not caught:
            survived.append(mutation.name)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutations caught")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
