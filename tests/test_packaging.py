"""The release's metadata agrees with itself: one version everywhere, and "all" installs every extra."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import layerwise as lw

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_one_version_in_the_package_its_metadata_the_cli_and_the_changelog():
    assert lw.__version__ == PROJECT["version"] == version("layerwise")
    run = subprocess.run([sys.executable, "-m", "layerwise.cli", "--version"], capture_output=True, text=True)
    assert run.stdout.strip() == f"layerwise {PROJECT['version']}"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    newest = re.search(r"^## \[(\d+\.\d+\.\d+)\]", changelog, re.M)
    assert newest is not None
    # the released version, or between releases the next one's .dev0 (what outputs written then
    # record as layerwise_version), with the changes under [Unreleased]
    ahead = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)\.dev0", PROJECT["version"])
    if ahead is None:
        assert newest.group(1) == PROJECT["version"]
    else:
        assert "## [Unreleased]" in changelog
        assert tuple(map(int, ahead.groups())) > tuple(map(int, newest.group(1).split(".")))


def test_all_installs_every_extra_but_the_test_tools():
    extras = PROJECT["optional-dependencies"]
    (spec,) = extras["all"]
    named = set(re.fullmatch(r"layerwise\[([\w,]+)\]", spec).group(1).split(","))  # type: ignore[union-attr]
    assert named == set(extras) - {"all", "test"}


def test_ci_runs_the_test_command_the_readme_gives():
    """The README's test command is what CI runs, word for word."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    after = readme.split("Run the tests", 1)[1]
    command = after.split("```bash\n", 1)[1].split("\n", 1)[0]
    assert "pytest" in command
    assert command in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
