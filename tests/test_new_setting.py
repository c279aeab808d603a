"""A new setting is one edit: a copy of the package with one more field in ``Settings`` offers it on
every command that loads a model, hands it to the Encoder whole, records it in every output's
metadata (``read_meta``), joins the resume checks when it changes the numbers, and refuses a bad
value by name, with no other line changed. A new server limit likewise: one more field in
``ServeSettings`` is an option of ``layerwise serve`` that reaches the server's settings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "layerwise"
ANCHOR = "    method: Method = setting("
NEW_FIELD = (
    '    probe_me: int | None = setting(None, "A setting added by a test", numbers=True, whole=True)\n'
)

# run in the copy: every command with the model options has the new one; the Settings, the Encoder and
# numbers_keys see it
CHECKS = """
import json, sys
import layerwise as lw
from typer.main import get_command
from layerwise.cli import app
from layerwise._settings.settings import Settings, numbers_keys

def commands(group, path=()):
    for name, command in getattr(group, "commands", {}).items():
        yield from commands(command, (*path, name))
    if not getattr(group, "commands", None):
        yield " ".join(path), group

with_model = {name: {p.name for p in c.params} for name, c in commands(get_command(app))
              if "model_dtype" in {p.name for p in c.params}}
enc = lw.Encoder(sys.argv[1], device="cpu", probe_me=3)
print(json.dumps({
    "commands": sorted(with_model),
    "lacking": sorted(n for n, ps in with_model.items() if "probe_me" not in ps),
    "numbers_keys": list(numbers_keys(Settings)), "encoder": enc.settings.probe_me,
    "engine": enc.engine.settings.probe_me, "meta": enc.run_meta(lw.OutputPlan())["probe_me"],
}))
"""


def _one_edit(root: Path, module: str, anchor: str, field: str) -> Path:
    """The package copied under ``root``, with the one edit: ``field`` before ``anchor`` in
    ``_settings/<module>``."""
    shutil.copytree(SRC, root / "layerwise", ignore=shutil.ignore_patterns("__pycache__"))
    edited = root / "layerwise" / "_settings" / module
    source = edited.read_text(encoding="utf-8")
    assert source.count(anchor) == 1, f"the test's anchor line moved: point it at a field of {module}"
    edited.write_text(source.replace(anchor, field + anchor), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def edited(tmp_path_factory) -> Path:
    """The package copied, with the one edit: a field in Settings."""
    return _one_edit(tmp_path_factory.mktemp("one-edit"), "settings.py", ANCHOR, NEW_FIELD)


def _run(edited: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(edited), "COLUMNS": "200"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=300)


def test_a_new_field_reaches_every_command_the_encoder_and_the_resume_keys(edited, make_tiny_model):
    model = make_tiny_model("bert", 2)
    run = _run(edited, "-c", CHECKS, str(model))
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert {"extract", "serve", "cache", "layers", "analyze"} <= set(seen["commands"]), seen["commands"]
    assert seen["lacking"] == []
    assert "probe_me" in seen["numbers_keys"]
    assert (seen["encoder"], seen["engine"], seen["meta"]) == (3, 3, 3)


def test_a_new_option_is_recorded_checked_on_resume_and_refused_when_bad(edited, make_tiny_model, tmp_path):
    model, texts = make_tiny_model("bert", 2), tmp_path / "texts.txt"
    texts.write_text("the river bank\nthe bank of England\n")
    cli = ["-m", "layerwise.cli"]
    out = tmp_path / "out.npz"
    run = _run(edited, *cli, "extract", str(texts), "-o", str(out), "--model", str(model), "--probe-me", "7")
    assert run.returncode == 0, run.stderr
    read = _run(edited, "-c", f"import layerwise as lw; print(lw.read_meta({str(out)!r})['probe_me'])")
    assert read.stdout.strip() == "7", read.stderr
    store = tmp_path / "texts.lw"
    to_store = [*cli, "extract", str(texts), "-o", str(store), "--model", str(model), "--probe-me"]
    first = _run(edited, *to_store, "7")
    assert first.returncode == 0, first.stderr
    again = _run(edited, *to_store, "8")
    assert again.returncode == 2 and "probe_me" in again.stderr, again.stderr
    bad = _run(edited, *cli, "extract", str(texts), "-o", str(tmp_path / "b.npz"), "--probe-me", "0")
    assert bad.returncode == 2 and "--probe-me" in bad.stderr, bad.stderr
    help_text = _run(edited, *cli, "serve", "--help").stdout
    assert "--probe-me" in help_text and "A setting added by a test" in help_text


SERVE_ANCHOR = "    stride: int | None = limit("
SERVE_FIELD = '    probe_limit: int = limit(7, "A limit added by a test", min=1)\n'


@pytest.fixture(scope="module")
def edited_server(tmp_path_factory) -> Path:
    """The package copied, with the one edit: a field in ServeSettings."""
    return _one_edit(tmp_path_factory.mktemp("one-limit"), "serve.py", SERVE_ANCHOR, SERVE_FIELD)


def test_a_new_server_limit_is_an_option_of_serve_that_reaches_its_settings(edited_server):
    run = _run(edited_server, "-m", "layerwise.cli", "serve", "--help")
    assert run.returncode == 0, run.stderr
    assert "--probe-limit" in run.stdout and "A limit added by a test" in run.stdout
    bad = _run(edited_server, "-m", "layerwise.cli", "serve", "--probe-limit", "0")
    assert bad.returncode == 2 and "--probe-limit" in bad.stderr, bad.stderr
    built = _run(edited_server, "-c", BUILD_SERVED)
    assert built.returncode == 0, built.stderr
    assert json.loads(built.stdout.strip().splitlines()[-1]) == {
        "probe_limit": 11,
        "max_body_bytes": 2 * 2**20,
    }


# the server's settings as the command builds them from its options (its option group's build)
BUILD_SERVED = """
import inspect, json
import layerwise.cli._serve as serve_cli
command = serve_cli.server_options()(lambda served: served)
values = {name: p.default for name, p in inspect.signature(command).parameters.items()}
served = command(**{**values, "probe_limit": 11, "max_body_mb": 2.0})
print(json.dumps({"probe_limit": served.probe_limit, "max_body_bytes": served.max_body_bytes}))
"""
