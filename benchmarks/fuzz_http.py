"""Property-based testing of `layerwise serve`'s HTTP surface with schemathesis, from /openapi.json.

    python benchmarks/fuzz_http.py [--examples 1000] [--model PATH]

Starts the server in this process on 127.0.0.1 (the default model, an API key, explorer texts up to
512 tokens so that an example takes milliseconds, not seconds) and sends, for every operation of
its /openapi.json, ``--examples`` requests generated from the schema (valid and invalid bodies,
authenticated); /v1/layers once more with ``Accept: application/x-npz``. Every answer is checked:
no 5xx, its status documented, its content type documented, its body valid against the documented
schema. Prints and writes (benchmarks/results/fuzz_http.json) the requests per operation, their
statuses and every failure. tests/test_serve_schema.py runs the same function with 20 examples.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
KEY = "fuzz-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
NPZ = "application/x-npz"


def checks() -> list:
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    return [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]


def fuzz(url: str, examples: int) -> tuple[dict[str, str], dict[str, dict[int, int]]]:
    """Every operation of ``url``'s /openapi.json, ``examples`` generated requests each:
    ``({operation: its first failure}, {operation: {status: requests}})``."""
    import schemathesis

    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=AUTH)
    failures: dict[str, str] = {}
    statuses: dict[str, collections.Counter] = {}
    passes = []
    for found in schema.get_all_operations():
        operation = found.ok()
        passes.append((operation, operation.label, AUTH))
        if operation.label == "POST /v1/layers":
            passes.append((operation, f"{operation.label} (Accept: {NPZ})", {**AUTH, "accept": NPZ}))
    for operation, label, headers in passes:
        seen = statuses.setdefault(label, collections.Counter())
        check = _checker(operation, url, headers, seen, examples)
        try:
            check()
        except Exception as exc:  # schemathesis' report: which check failed, on which request
            failures[label] = _report(exc)[:4000]
    return failures, {label: dict(sorted(counts.items())) for label, counts in statuses.items()}


def _report(exc: BaseException) -> str:
    """An exception with what it groups (Hypothesis' "unreliable" failures hold the first call's
    error inside), each once."""
    parts = [f"{type(exc).__name__}: {exc}"]
    for inner in getattr(exc, "exceptions", None) or ():
        parts.append(_report(inner))
    if exc.__cause__ is not None:
        parts.append(_report(exc.__cause__))
    return "\n".join(dict.fromkeys(parts))


def _checker(operation, url: str, headers: dict, seen: collections.Counter, examples: int):
    """A Hypothesis test of ``operation``: each generated request sent and its answer checked."""
    from hypothesis import HealthCheck, given, settings

    @given(operation.as_strategy())
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def check(case) -> None:
        # the explorer's first projection builds its reference set (seconds on 2 cores): a slow
        # answer is not a failure, only a wrong one is
        response = case.call_and_validate(base_url=url, headers=headers, checks=checks(), timeout=120)
        seen[response.status_code] += 1

    return check


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", type=Path, default=None, help="Write the results here instead")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import write_result
    from conftest import running_server

    import layerwise as lw
    from layerwise.serve import ServeSettings, create_app

    encoder = lw.Encoder(args.model, device="cpu")
    app = create_app({encoder.name: encoder}, ServeSettings(api_key=KEY, max_explore_tokens=512))
    started = time.perf_counter()
    with running_server(app) as url:
        failures, statuses = fuzz(url, args.examples)
    seconds = time.perf_counter() - started
    for label, counts in statuses.items():
        print(f"{label:48} {sum(counts.values()):6,} requests  {counts}")
    server_errors = sum(n for counts in statuses.values() for status, n in counts.items() if status >= 500)
    print(f"{len(failures)} failing operations, {server_errors} server errors, {seconds / 60:.1f} min")
    for label, report in failures.items():
        print(f"\n{label}:\n{report}")
    write_result("fuzz_http", {
        "model": encoder.name, "examples_per_operation": args.examples, "minutes": round(seconds / 60, 1),
        "requests": sum(sum(c.values()) for c in statuses.values()), "server_errors": server_errors,
        "failures": failures, "statuses": statuses,
    }, args.out)  # fmt: skip


if __name__ == "__main__":
    main()
