"""A hostile pass over the families: every option and path layerwise offers, on tiny random models of
each family it accepts, compared with transformers run on each text alone. Target: no wrong
number and no traceback.

    python benchmarks/hostile_families.py [--families llama,t5] [--quick]

For each family (the tiny models of tests/any_models.py, tests/decoder_models.py and a sample of
the sweep's types, tests/sweep_models.py), each case is one call, and its outcome one of:

- **equal**: the numbers equal the independent computation (atol 1e-5, rtol 1e-4), or a bad input
  was refused by name as it must be;
- **refused**: a layerwise error that names why (a tap the family lacks, a model that does not
  stream, a final norm that cannot be separated);
- **wrong**: other numbers, or a bad input accepted;
- **traceback**: any exception that is not layerwise's.

The independent computation: transformers' ``output_hidden_states`` of each text alone (no padding);
the raw last state is the input of the final norm module, hooked by the names transformers gives it;
``final_norm="all"`` is that module applied to every state. The cases:

- three loads (the packed forward, transformers' padded forward with ``packed=False``, the
  layer-streamed forward) × two methods × four final norms (default, True, False, "all"): 24;
- layers [0], [-1], [1, -1], and two out of range (refused); batch size 1, and the texts reversed;
- each of the five taps by both methods (the two must agree, or both refuse it);
- ``embed`` with mean pooling against the mean of transformers' states;
- an empty text and a blank one (refused), a text past the model's maximum (truncated and
  windowed);
- the command line's ``extract`` to .npz against the Python API.

Results: benchmarks/results/hostile_families.json (counts by outcome, by family, the refusals by
reason, the largest difference of an equal case).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from common import write_result  # noqa: E402
from sweep_models import leaves_out_embeddings, watch_first_layer  # noqa: E402

TEXTS = ["The bank raised rates.", "A much longer sentence about the river bank, and the fish in it.", "Hi"]
ATOL, RTOL = 1e-5, 1e-4
# the sweep's types read here beyond the test families: the BERT layout, the models read from
# transformers' own states, and decoders of the general path
SWEPT = (
    "bert", "roberta", "electra", "distilbert", "mpnet", "albert", "xlm", "convbert", "longformer",
    "biogpt", "xglm", "cohere", "mbart", "mamba", "fnet", "squeezebert", "marian", "nystromformer",
)  # fmt: skip
# what transformers names a model's final norm (the test's own list, not layerwise's)
NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "final_norm", "norm_f", "layer_norm")


class Wrong(Exception):
    """A case whose numbers differ, or whose bad input was accepted."""


def families(chosen: set[str] | None) -> dict[str, Callable[[Path], Path]]:
    from any_models import FAMILIES, save_family
    from decoder_models import DECODER_ARCHITECTURES, save_decoder
    from sweep_models import save_swept

    made: dict[str, Callable[[Path], Path]] = {}
    for name in DECODER_ARCHITECTURES:
        made[name] = lambda folder, name=name: save_decoder(name, folder)
    for name in FAMILIES:
        made[name] = lambda folder, name=name: save_family(name, folder)
    for name in SWEPT:
        made.setdefault(name, lambda folder, name=name: save_swept(name, folder))
    return {k: v for k, v in made.items() if chosen is None or k in chosen}


def final_norm_of(model: Any) -> Any:
    """The model's final norm by transformers' names, or None (then the last state is the raw one)."""
    for owner in (model, getattr(model, "decoder", None)):
        for name in NORM_NAMES:
            module = getattr(owner, name, None) if owner is not None else None
            if isinstance(module, torch.nn.Module) and not isinstance(module, torch.nn.ModuleList):
                return module
    return None


def _keep_input(seen: dict, module: Any, args: tuple, output: Any) -> None:
    seen.setdefault("x", args[0])  # a hook that returned it would replace the module's output


class Reference:
    """transformers' states of each text alone: as returned, raw (the final norm's input in place of
    the last), and every state through the final norm."""

    def __init__(self, folder: Path) -> None:
        import inspect

        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModel.from_pretrained(folder).eval()
        self.model = model.get_encoder() if model.config.is_encoder_decoder else model
        norm = final_norm_of(self.model)
        given = (
            {"use_cache": False} if "use_cache" in inspect.signature(self.model.forward).parameters else {}
        )
        self.states, self.raw, self.all_normed = [], [], []
        n = self.model.config.num_hidden_layers
        lists = (m for m in self.model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n)
        first = next(lists, [None])[0]
        for text in TEXTS:
            around: dict = {}
            seen: dict = {}
            hooks = [] if first is None else watch_first_layer(first, around)
            if norm is not None:
                hooks.append(norm.register_forward_hook(functools.partial(_keep_input, seen)))
            with torch.no_grad():
                ids = self.tokenizer(text, return_tensors="pt", return_token_type_ids=False)["input_ids"]
                out = self.model(input_ids=ids, output_hidden_states=True, **given)
            for hook in hooks:
                hook.remove()
            # the last state transformers gives is its model's output: after the final norm
            given_states = [*out.hidden_states[:-1], out.last_hidden_state]
            if leaves_out_embeddings(list(out.hidden_states), around):  # Mamba's: state 0 is layer 1's
                given_states = [around["in"], *out.hidden_states[: n - 1], out.last_hidden_state]
            states = torch.stack(given_states)[:, 0]
            raw = states.clone()
            separable = norm is not None and "x" in seen and seen["x"].shape[-2:] == states.shape[-2:]
            with torch.no_grad():
                separable = separable and torch.allclose(norm(seen["x"])[0], states[-1], atol=1e-6)
                if separable:
                    raw[-1] = seen["x"][0]
                self.all_normed.append(norm(raw).numpy() if separable else None)
            self.states.append(states.numpy())
            self.raw.append(raw.numpy())
        self.has_norm = any(
            not np.array_equal(s[-1], r[-1]) for s, r in zip(self.states, self.raw, strict=True)
        )

    def expected(self, final_norm: Any) -> list[np.ndarray] | None:
        """The states a call with ``final_norm`` must return; None where it must be refused."""
        if final_norm in (None, True):
            return self.states
        if final_norm is False:
            return self.raw
        if not self.has_norm or any(a is None for a in self.all_normed):
            return None
        return self.all_normed  # type: ignore[return-value]


def same(got: np.ndarray, want: np.ndarray, what: str) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise Wrong(f"{what}: shape {got.shape}, expected {want.shape}")
    diff = float(np.max(np.abs(got - want))) if got.size else 0.0
    if not np.allclose(got, want, atol=ATOL, rtol=RTOL):
        raise Wrong(f"{what}: differs by {diff:.3g}")
    return diff


class Pass:
    """The cases of one family, each counted by outcome."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.outcomes: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()
        self.failures: list[str] = []
        self.largest = 0.0

    def case(self, name: str, run: Callable[[], float | None], *, refusal_expected: bool = False) -> None:
        import layerwise as lw

        try:
            diff = run()
        except Wrong as exc:
            self._failed("wrong", name, str(exc))
            return
        except lw.LayerwiseError as exc:
            if refusal_expected:
                self.outcomes["equal"] += 1
            else:
                self.outcomes["refused"] += 1
                self.refusals[_reason(str(exc), self.family)] += 1
            return
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            self._failed("traceback", name, detail)
            return
        if refusal_expected:
            self._failed("wrong", name, "a bad input was accepted")
            return
        self.outcomes["equal"] += 1
        self.largest = max(self.largest, diff or 0.0)

    def _failed(self, outcome: str, name: str, detail: str) -> None:
        self.outcomes[outcome] += 1
        self.failures.append(f"{self.family} / {name}: {outcome}: {detail[:300]}")
        print(f"  {outcome.upper()} {name}: {detail[:300]}", flush=True)


def _reason(message: str, family: str) -> str:
    """A refusal's reason, for counting: its first clause, the model's path and family left out."""
    reason = re.sub(r"'/[^']*'", "…", message.split(";")[0])
    for name in {family, family.replace("-", "_"), family.replace("_", "-")}:
        reason = reason.replace(f"'{name}'", "'X'").replace(f"({name})", "(X)")
    return reason.strip()[:200]


def states_equal(stacks: list[Any], want: list[np.ndarray], layers: list[int] | None = None) -> float:
    diff = 0.0
    for stack, states in zip(stacks, want, strict=True):
        expected = states if layers is None else states[layers]
        diff = max(diff, same(stack.hidden, expected, "hidden states"))
    return diff


def run_family(family: str, make: Callable[[Path], Path], workdir: Path) -> Pass:
    from typer.testing import CliRunner

    import layerwise as lw
    from layerwise.cli import app

    result = Pass(family)
    try:
        folder = make(workdir / family)
    except Exception as exc:
        print(f"{family}: not built ({type(exc).__name__}: {str(exc)[:120]})")
        return result
    try:
        reference = Reference(folder)
    except Exception as exc:
        print(f"{family}: transformers cannot run it alone ({type(exc).__name__}: {str(exc)[:120]})")
        return result
    loads: dict[str, Any] = {}
    for load, options in {
        "packed": {},
        "padded": {"packed": False},
        "streamed": {"streaming": True, "stream_block_tokens": 16},
    }.items():

        def opened(options=options, load=load) -> None:
            loads[load] = lw.Encoder(folder, device="cpu", **options)

        result.case(f"load {load}", opened)
    n_states = reference.states[0].shape[0]
    for load, encoder in loads.items():
        for method in (None, "hooks"):
            for final_norm in (None, True, False, "all"):
                want = reference.expected(final_norm)

                def call(encoder=encoder, method=method, final_norm=final_norm, want=want) -> float:
                    stacks = encoder.extract(TEXTS, layers="all", method=method, final_norm=final_norm)
                    if want is None:
                        raise Wrong(
                            f"final_norm={final_norm!r} accepted on a model whose norm it cannot apply"
                        )
                    return states_equal(stacks, want)

                # a final norm that cannot be applied is refused by name: that is the expected outcome
                result.case(
                    f"{load} method={method} final_norm={final_norm!r}", call, refusal_expected=want is None
                )
    encoder = loads.get("packed")
    if encoder is None:
        return result
    for layers in ([0], [-1], [1, -1]):
        chosen = [i % n_states for i in layers]
        result.case(
            f"layers={layers}",
            lambda layers=layers, chosen=chosen: states_equal(
                encoder.extract(TEXTS, layers=layers), reference.states, chosen
            ),
        )
    for layers in ([n_states], [-n_states - 1]):
        result.case(
            f"layers={layers}",
            lambda layers=layers: encoder.extract(TEXTS, layers=layers),
            refusal_expected=True,
        )
    result.case("batch_size=1", lambda: states_equal(encoder.extract(TEXTS, batch_size=1), reference.states))
    result.case(
        "texts reversed",
        lambda: states_equal(encoder.extract(TEXTS[::-1]), reference.states[::-1]),
    )
    for tap in ("attention_probs", "attention_output", "intermediate", "attn_out", "mlp_out"):
        result.case(f"tap {tap}", lambda tap=tap: _taps_agree(encoder, tap))
    result.case("embed mean", lambda: _mean_pooled(encoder, reference))
    result.case("empty text", lambda: _blank(encoder, ""))
    result.case("blank text", lambda: _blank(encoder, "   "))
    long_text = " ".join(["the river bank"] * 400)
    result.case("long text truncated", lambda: _long(encoder, long_text, "truncate"))
    result.case("long text windowed", lambda: _long(encoder, long_text, "window"))
    result.case("command line", lambda: _command_line(encoder, folder, workdir, CliRunner(), app))
    return result


def _taps_agree(encoder: Any, tap: str) -> float:
    import layerwise as lw

    try:
        packed = encoder.extract(TEXTS, layers=[0, 1, 2], taps=[tap])
    except lw.LayerwiseError:
        try:
            encoder.extract(TEXTS, layers=[0, 1, 2], taps=[tap], method="hooks")
        except lw.LayerwiseError:
            raise  # refused both ways: named
        raise Wrong(f"tap {tap} refused by the default method but given by hooks") from None
    hooked = encoder.extract(TEXTS, layers=[0, 1, 2], taps=[tap], method="hooks")
    diff = 0.0
    for a, b in zip(packed, hooked, strict=True):
        diff = max(diff, same(a.taps[tap], b.taps[tap], f"tap {tap}, packed vs hooks"))
        if a.taps[tap].shape[1 if tap != "attention_probs" else 2] != a.n_tokens:
            raise Wrong(f"tap {tap}: {a.taps[tap].shape} for {a.n_tokens} tokens")
    return diff


def _mean_pooled(encoder: Any, reference: Reference) -> float:
    got = encoder.embed(TEXTS, layers=[-1], pool="mean")
    want = np.stack([states[-1].mean(axis=0) for states in reference.states])
    return same(np.asarray(got).reshape(want.shape), want, "mean pooling")


def _blank(encoder: Any, text: str) -> float:
    """A text of no words: its special tokens' states (finite), or refused by name (no tokens)."""
    import layerwise as lw

    try:
        (stack,) = encoder.extract([text])
    except lw.InputError:
        return 0.0
    if not np.isfinite(stack.hidden).all():
        raise Wrong(f"{text!r} gave non-finite numbers")
    return 0.0


def _long(encoder: Any, text: str, long_texts: str) -> float:
    (stack,) = encoder.extract([text], layers=[-1], long_texts=long_texts)
    if not np.isfinite(stack.hidden).all():
        raise Wrong(f"long_texts={long_texts!r} gave non-finite numbers")
    if long_texts == "window" and stack.n_tokens < 1000:
        raise Wrong(f"long_texts='window' kept {stack.n_tokens} tokens of a 1,200-word text")
    return 0.0


def _command_line(encoder: Any, folder: Path, workdir: Path, runner: Any, app: Any) -> float:
    texts, out = workdir / "texts.txt", workdir / f"{folder.name}.npz"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    ran = runner.invoke(
        app, ["extract", str(texts), "-o", str(out), "-m", str(folder), "--layers", "-1", "-q"]
    )
    if ran.exit_code != 0:
        if ran.exit_code == 2 and "Traceback" not in ran.output:
            import layerwise as lw

            raise lw.LayerwiseError(ran.output.strip().splitlines()[-1])
        raise RuntimeError(f"exit {ran.exit_code}: {ran.output[-300:]}")
    saved = np.load(out)
    python = encoder.extract(TEXTS, layers=[-1])
    diff = 0.0
    for k, stack in enumerate(python):
        diff = max(diff, same(saved[f"hidden_{k}"], stack.hidden, "command line vs Python"))
    return diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", help="comma-separated family names (default: all)")
    args = parser.parse_args()
    chosen = set(args.families.split(",")) if args.families else None
    start = time.perf_counter()
    passes = []
    with tempfile.TemporaryDirectory() as tmp:
        for family, make in families(chosen).items():
            t0 = time.perf_counter()
            done = run_family(family, make, Path(tmp))
            passes.append(done)
            counts = ", ".join(f"{k} {v}" for k, v in sorted(done.outcomes.items()))
            print(f"{family}: {counts} ({time.perf_counter() - t0:.1f} s)", flush=True)
    total: Counter[str] = Counter()
    refusals: Counter[str] = Counter()
    for done in passes:
        total.update(done.outcomes)
        refusals.update(done.refusals)
    tested = [p for p in passes if p.outcomes]
    report = {
        "families": len(tested),
        "family_names": [p.family for p in tested],
        "not_built": [p.family for p in passes if not p.outcomes],
        "cases": sum(total.values()),
        "outcomes": {k: total.get(k, 0) for k in ("equal", "refused", "wrong", "traceback")},
        "largest_difference": max((p.largest for p in passes), default=0.0),
        "tolerance": {"atol": ATOL, "rtol": RTOL},
        "by_family": {p.family: dict(p.outcomes) for p in tested},
        "refusals": dict(refusals.most_common()),
        "failures": [f for p in passes for f in p.failures],
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(
        f"{report['cases']} cases over {report['families']} families: "
        + ", ".join(f"{k} {v}" for k, v in report["outcomes"].items())
    )
    if chosen is None:
        print(f"wrote {write_result('hostile_families', report)}")


if __name__ == "__main__":
    main()
