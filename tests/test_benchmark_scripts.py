"""Every benchmark script still runs: each answers --help (its imports and arguments work after a
rename), and the one whose run takes seconds (re-scoring the recorded layers) runs whole, writing
into a temporary folder (LAYERWISE_RESULTS_DIR), never over the committed results.

A run of the others takes minutes to hours on 2 cores; their figures are checked against their
result files by tests/test_figures.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO

SCRIPTS = sorted(p for p in (REPO / "benchmarks").glob("*.py") if p.name != "common.py")


def _run(args: list[str], env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def _smoke(path) -> subprocess.CompletedProcess:
    """A script's --help; a helper module (no __main__: gpu_limits, layer_tasks) imported."""
    if '__name__ == "__main__"' in path.read_text(encoding="utf-8"):
        return _run([str(path), "--help"])
    probe = f"import sys; sys.path.insert(0, 'benchmarks'); import {path.stem}; print('usage: imported')"
    return _run(["-c", probe])


@pytest.mark.slow
def test_every_benchmark_script_answers_help():
    assert len(SCRIPTS) > 30
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda p: (p.name, _smoke(p)), SCRIPTS))
    broken = [f"{name}: {r.returncode} {r.stderr.strip()[-400:]}" for name, r in results
              if r.returncode != 0 or "usage" not in r.stdout]  # fmt: skip
    assert not broken, "\n".join(broken)


def test_label_free_rescore_runs_and_reproduces_the_shipped_rules(tmp_path):
    """It once wrote to the 0.2 path src/layerwise/analysis/data and ended in FileNotFoundError."""
    result = _run(["benchmarks/label_free_layers.py", "--rescore"], {"LAYERWISE_RESULTS_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads((tmp_path / "label_free_rules.json").read_text())
    shipped = json.loads((REPO / "src/layerwise/_analysis/data/label_free_rules.json").read_text())
    assert written == shipped
    assert (tmp_path / "label_free_layers.json").exists()


def test_run_all_measures_published_figures_one_script_at_a_time():
    """--jobs runs quick checks at once; full mode refuses it before running anything, and --list
    shows each mode's arguments (the quick ones are the shorter parts)."""
    refused = _run(["benchmarks/run_all.py", "--jobs", "2", "--only", "roof"], timeout=60)
    assert refused.returncode == 2 and "--jobs is for --quick" in refused.stderr
    listed = _run(["benchmarks/run_all.py", "--list", "--only", "serve_load,corpus_io"], timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert (
        "serve_load: full --ratio-rounds 7; quick --clients 1,8 --seconds 2 --texts 100 --soak 2"
        in listed.stdout
    )
    assert (
        "corpus_io: full (defaults); quick --part speed --speed-texts 300 --speed-rounds 1" in listed.stdout
    )


def test_fuzz_alignment_records_each_failure_with_its_shrunk_input(monkeypatch):
    """When hypothesis finds several distinct failures it raises a group: each one is recorded with
    hypothesis' note on the input that fails, not the group's one-line message."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from fuzz_alignment import described

    @settings(max_examples=300, database=None, deadline=None, derandomize=True)
    @given(x=st.integers())
    def run(x):
        assert x < 10
        if x < -5:
            raise ValueError("negative")

    with pytest.raises(BaseExceptionGroup) as caught:
        run()
    errors = described(caught.value)
    assert sorted(error.split(":")[0] for error in errors) == ["AssertionError", "ValueError"]
    assert any(error.startswith("AssertionError: assert 10 < 10") for error in errors)  # shrunk to 10
    assert all("Failing test case: run(" in error for error in errors)  # hypothesis' note on its input
