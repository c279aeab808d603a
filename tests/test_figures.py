"""Published figures equal their result files.

Every measured figure of README.md and docs/ is rendered from its result file by
``scripts/render_figures.py``: a block (``<!-- figures: NAME -->``) or a figure inside a sentence
(``<!-- fig: NAME -->``), and a document that differs from a fresh render fails. Every other figure
with a unit (×, %, s, min, ms, MB, GiB, tokens/s, …) outside them is named in
``tests/figures_not_measured.txt`` with what it is instead (a setting, a target, an input size, a
format, arithmetic on paper): a figure typed by hand that is neither fails, and so does a listed
figure changed by hand. Also: every Python path the docs name exists, every result file records the
machine (CPU model, cores) and the commit it ran at, and every derived figure of a result file
agrees with its raw rounds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import REPO

RESULTS = REPO / "benchmarks" / "results"
UNIT = (
    r"×(?!\s*\d)|x\b|%|\s?ms\b|\s?s\b|\s?MB/s|\s?GB/s|\s?tok/s|\s?tokens/s|\s?texts/s|\s?GiB|\s?MiB"
    r"|\s?GB|\s?MB|\s?min\b"
)
FIGURE = re.compile(
    r"(?<![\w.\-/])(\d{1,3}(?:,\d{3})+|\d+\.\d+|\d+)(?![eE]-?\d|\.\d|\d)(\s?(?:" + UNIT + r"))?"
)
RENDERED = re.compile(
    r"<!-- figures: [\w-]+ -->.*?<!-- /figures -->|<!-- fig: [\w-]+ -->.*?<!-- /fig -->", re.DOTALL
)
NOT_MEASURED = REPO / "tests" / "figures_not_measured.txt"
KINDS = {"setting", "target", "input size", "format", "on paper", "a status code"}


def documents() -> dict[str, str]:
    """README.md, benchmarks/README.md and every page of docs/ (the CHANGELOG's copy aside)."""
    paths = [REPO / "README.md", REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return {
        str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in paths if p.name != "changelog.md"
    }


def typed_figures(text: str) -> set[str]:
    """The figures with a unit of ``text`` outside rendered blocks, code and links."""
    text = RENDERED.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    prose = re.sub(r"`[^`]*`|https?://\S+|\]\([^)]*\)", "", text)
    return {m.group(0).strip() for line in prose.splitlines() for m in FIGURE.finditer(line) if m.group(2)}


def not_measured() -> dict[tuple[str, str], str]:
    listed = {}
    for line in NOT_MEASURED.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            path, figure, kind = (part.strip() for part in line.split("|"))
            listed[(path, figure)] = kind
    return listed


def passages() -> list[tuple[str, str]]:
    """(where, text) of each paragraph, list item and table row of the published text."""
    out = []
    for where, text in documents().items():
        out += [(where, unit) for unit in re.split(r"\n\s*\n|\n(?=\s*[-*|] )", RENDERED.sub("", text))]
    return out


def test_every_figure_outside_a_rendered_block_is_listed_as_not_a_measurement():
    listed = not_measured()
    typed = {(where, figure) for where, text in documents().items() for figure in typed_figures(text)}
    unlisted = sorted(typed - set(listed))
    assert not unlisted, (
        "figures typed by hand: render each measured one from its result file (scripts/render_figures.py), "
        f"or list what it is in {NOT_MEASURED.name}: {unlisted}"
    )
    assert not sorted(set(listed) - typed), f"{NOT_MEASURED.name} lists figures no page has"
    assert set(listed.values()) <= KINDS, f"what a listed figure is: one of {sorted(KINDS)}"


def test_a_figure_typed_by_hand_is_caught():
    """+20 % to a listed setting, or a measurement typed into a sentence, fails the listing."""
    listed = not_measured()
    text = documents()["docs/benchmarks.md"]
    figures = typed_figures(text)
    assert ("docs/benchmarks.md", "162 MB") in listed and "162 MB" in figures
    edited = typed_figures(text.replace("162 MB", "194 MB"))
    assert ("docs/benchmarks.md", "194 MB") not in listed and "194 MB" in edited
    assert "7,857 tokens/s" in typed_figures(text + "\nThe packed forward ran 7,857 tokens/s.\n")


def test_every_python_path_the_docs_name_exists():
    missing = []
    for where, text in passages():
        for path in set(re.findall(r"((?:[\w.-]+/)+[\w.-]+\.py)\b", text)):
            base = REPO / where.split(" ")[0]
            candidates = [
                REPO / path,
                REPO / "src" / path,
                REPO / "src" / "layerwise" / path,
                base.parent / path,
            ]
            if not any(c.exists() for c in candidates):
                missing.append(f"{where}: {path}")
    assert not missing, "\n".join(sorted(set(missing)))


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_every_result_file_records_its_machine_and_commit(path: Path):
    data = json.loads(path.read_text())
    machine = data.get("machine") or {}
    assert machine.get("cpu") and machine.get("cores"), f"{path.name} does not record its machine"
    assert machine.get("commit") or data.get("recorded_in_commit"), f"{path.name} records no commit"
    dirty = [c for c in _commits(data) if c.endswith("+")]
    in_run_all = path.stem in _run_all()
    rerun = f"`python benchmarks/run_all.py --only {path.stem}`" if in_run_all else "the script writing it"
    assert not dirty, (
        f"{path.name} was measured on an uncommitted tree ({dirty[0]}): commit, then re-run {rerun}"
    )


def _run_all() -> dict:
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from run_all import RUNS

    return RUNS


def _commits(data) -> list[str]:
    """Every commit a result file records, its merged parts' included."""
    if isinstance(data, dict):
        found = [v for k, v in data.items() if k in ("commit", "recorded_in_commit") and isinstance(v, str)]
        return found + [c for v in data.values() for c in _commits(v)]
    if isinstance(data, list):
        return [c for v in data for c in _commits(v)]
    return []


def test_a_dirty_commit_in_a_merged_part_is_found():
    data = {"machine": {"commit": "def5678"}, "parts": [{"machine": {"commit": "abc1234+"}}], "x": {}}
    data["x"]["recorded_in_commit"] = "9"
    assert _commits(data) == ["def5678", "abc1234+", "9"]


def test_run_all_records_each_script_and_the_sum():
    """The README's time of the full mode is the sum of each script's last full run."""
    RUNS = _run_all()
    data = json.loads((RESULTS / "run_all.json").read_text(encoding="utf-8"))
    scripts = data["full"]["scripts"]
    assert set(scripts) <= set(RUNS), f"times of scripts run_all does not run: {set(scripts) - set(RUNS)}"
    if all(scripts.get(name, {}).get("exit") == 0 for name in RUNS):
        assert data["full"]["seconds"] == round(sum(scripts[name]["seconds"] for name in RUNS))
    else:
        assert data["full"]["seconds"] is None
    quick = data.get("quick")
    if quick is not None:
        assert set(quick["scripts"]) == set(RUNS) and all(d["exit"] == 0 for d in quick["scripts"].values())
    runs = {**scripts, **({"quick": quick} if quick is not None else {})}
    unplaced = [name for name, run in runs.items() if not (run.get("cpu") and run.get("cores"))]
    assert not unplaced, f"run_all.json records no machine for {unplaced}: its times depend on one"


# --- rendered blocks: tables and headline sentences written from the result files -------------------


def _renderer():
    """scripts/render_figures.py, imported afresh (its result cache empty)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_figures", REPO / "scripts" / "render_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ageless(text: str) -> str:
    """``text`` without the ages of stale results ("…, over 300 commits ago"): an age grows with each
    commit, and one rendered earlier stays true (a lower bound), so a commit need not re-render."""
    return re.sub(r", over \d+ commits ago", "", text)


def test_every_rendered_block_equals_a_fresh_render_of_its_result_files():
    """A figure edited by hand, or a result file rerun without `python scripts/render_figures.py`,
    makes a document differ from its render."""
    render = _renderer()
    stale = []
    for relative in render.DOCUMENTS:
        text = _ageless((REPO / relative).read_text(encoding="utf-8"))
        fresh = _ageless(render.render(text))
        if fresh != text:
            old, new = text.splitlines(), fresh.splitlines()
            first = next(i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b)
            stale.append(f"{relative}:{first + 1}: {old[first][:100]!r} -> {new[first][:100]!r}")
    assert not stale, "run python scripts/render_figures.py:\n" + "\n".join(stale)


def test_every_renderer_has_its_block_once():
    render = _renderer()
    names = [
        m["name"]
        for relative in render.DOCUMENTS
        for m in render.BLOCK.finditer((REPO / relative).read_text(encoding="utf-8"))
    ]
    assert sorted(names) == sorted(render.BLOCKS), "each block of BLOCKS appears in one document, once"
    inline = [
        m["name"]
        for relative in render.DOCUMENTS
        for m in render.INLINE.finditer((REPO / relative).read_text(encoding="utf-8"))
    ]
    assert sorted(inline) == sorted(render.FIGURES), "each figure of FIGURES appears in one document, once"


def test_an_inline_figure_edited_by_hand_is_caught():
    """A figure inside a sentence (``<!-- fig: NAME -->``) is written afresh like a block: +20 % to
    it, or to its result, makes the document differ from its render."""
    render = _renderer()
    text = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    figure = next(m for m in render.INLINE.finditer(text) if m["name"] == "gemm-onednn-us")
    value = float(figure["body"].replace(",", ""))
    edited = text.replace(figure.group(0), figure.group(0).replace(figure["body"], f"{value * 1.2:,.0f}"))
    assert edited != text and render.render(edited) == render.render(text)
    render.result("gemm_speed")["forward_us_per_token"]["onednn"]["whole corpus"] *= 1.2
    assert render.render(text) != text


def test_a_figure_edited_by_hand_or_a_changed_result_is_caught():
    render = _renderer()
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = next(m for m in render.BLOCK.finditer(text) if m["name"] == "readme-speed")
    figure = re.search(r"\d,\d{3} tokens/s", block.group(0)).group(0)
    edited = text.replace(figure, figure.replace(figure[0], str((int(figure[0]) + 1) % 10), 1), 1)
    assert _ageless(render.render(edited)) == _ageless(text)  # a hand edit is rendered back: the test sees it
    assert edited != text
    packed = render.result("packed_speed")
    part = packed["default"]
    part["tokens_per_s"][part["default"]] += 1000  # a rerun whose figures the README does not show yet
    assert render.render(text) != text


def test_a_result_measured_over_100_commits_ago_says_so_where_it_is_shown():
    """#84 item 4: a block measured hundreds of commits back read as today's figure."""
    import subprocess

    render = _renderer()

    def commit(name: str) -> str:
        said = subprocess.run(["git", "rev-parse", "--short", name], cwd=REPO, capture_output=True, text=True)
        return said.stdout.strip() if said.returncode == 0 else ""

    head, old = commit("HEAD"), commit("HEAD~150")
    if not old:
        pytest.skip("a clone with less than 150 commits of history")
    assert render.age(head) == head
    assert render.age(head + "+") == head + "+"  # measured on an edited tree
    assert render.age(old) == f"{old}, over 100 commits ago"
    assert render.age("0000000") == "0000000"  # a commit this clone lacks: its age is unknown


# --- derived fields: what a result file computes from its raw rounds -------------------------------


def _derived_mismatches(node, where: str = "") -> list[str]:
    """Each tokens/s a result file derives from its rounds (tokens ÷ the median round's seconds),
    each ratio of two of them (``A_over_B``; ``default`` and ``fastest_loop`` name a key) and each
    fraction of the ceiling, recomputed; the ones that disagree with what the file says."""
    import statistics

    out: list[str] = []
    if isinstance(node, list):
        for i, item in enumerate(node):
            out += _derived_mismatches(item, f"{where}[{i}]")
        return out
    if not isinstance(node, dict):
        return out
    rates, tokens = node.get("tokens_per_s"), node.get("tokens")
    if isinstance(rates, dict) and isinstance(node.get("seconds"), dict) and isinstance(tokens, int):
        for key, rounds in node["seconds"].items():
            if key in rates and isinstance(rounds, list) and rounds:
                want = tokens / statistics.median(rounds)
                if abs(rates[key] - want) > max(1.0, 0.01 * want):
                    out.append(f"{where}: tokens_per_s.{key} {rates[key]} != {want:.0f} from its rounds")
    if isinstance(rates, dict) and isinstance(node.get("ratios"), dict):
        for key, ratio in node["ratios"].items():
            a, _, b = key.partition("_over_")
            a, b = node.get(a, a) if a == "default" else a, node.get(b, b) if b == "fastest_loop" else b
            if a in rates and b in rates and abs(ratio - rates[a] / rates[b]) > max(0.006, 0.005 * ratio):
                out.append(f"{where}: ratios.{key} {ratio} != {rates[a] / rates[b]:.2f}")
    ceiling = node.get("ceiling_tokens_per_s")
    if isinstance(rates, dict) and isinstance(node.get("fraction_of_ceiling"), dict) and ceiling:
        for key, fraction in node["fraction_of_ceiling"].items():
            # the file divides unrounded rates by a ceiling it rounds: half a percent apart at most
            if key in rates and abs(fraction - rates[key] / ceiling) > max(0.0006, 0.005 * fraction):
                out.append(f"{where}: fraction_of_ceiling.{key} {fraction} != {rates[key] / ceiling:.3f}")
    for key, value in node.items():
        out += _derived_mismatches(value, f"{where}/{key}")
    return out


def test_every_derived_figure_agrees_with_its_raw_rounds():
    """#84 item 3: a changed raw round left its tokens/s and ratios as they were, and every test passed."""
    wrong = [
        f"{path.name}{line}"
        for path in sorted(RESULTS.glob("*.json"))
        for line in _derived_mismatches(json.loads(path.read_text(encoding="utf-8")))
    ]
    assert not wrong, "\n".join(wrong)


def test_a_changed_raw_round_is_caught():
    data = json.loads((RESULTS / "packed_speed.json").read_text(encoding="utf-8"))
    assert not _derived_mismatches(data)
    rounds = data["default"]["seconds"]["packed_2_streams"]
    rounds[:] = [r * 1.2 for r in rounds]  # each round 20 % slower: the median with it
    said = _derived_mismatches(data)
    assert any("tokens_per_s.packed_2_streams" in line for line in said), said
    data = json.loads((RESULTS / "packed_speed.json").read_text(encoding="utf-8"))
    data["default"]["ratios"]["default_over_fastest_loop"] *= 1.2
    assert any("ratios.default_over_fastest_loop" in line for line in _derived_mismatches(data))
