"""Published figures equal their result files.

Every passage of README.md, docs/ and the CHANGELOG's unreleased section that names a benchmark
script (``benchmarks/NAME.py``) or its result (``benchmarks/results/NAME.json``) is read, and each
figure in it (a number with a unit such as ×, %, s, ms, tokens/s, MB/s, MiB, or with a decimal
point) must be in that script's result file: as recorded (at the figure's precision), or produced
from it by a unit's scale (bytes as MB, seconds as ms, a fraction as %) or as the ratio of two
numbers recorded side by side (a speed-up, a percentage change). A passage of arithmetic on stated
inputs ("on paper") names no script. Also: every Python path the docs name exists, and every
result file records the machine (CPU model, cores) and the commit it ran at.
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
    r"|\s?GB|\s?MB"
)
FIGURE = re.compile(
    r"(?<![\w.\-/])(\d{1,3}(?:,\d{3})+|\d+\.\d+|\d+)(?![eE]-?\d|\.\d|\d)(\s?(?:" + UNIT + r"))?"
)
SCALES = {"MB": (1, 1e-6), "GB": (1, 1e-3, 1e-9), "MiB": (1, 2**-20), "GiB": (1, 2**-30, 2**-10),
          "ms": (1, 1e3), "%": (1, 100)}  # fmt: skip


def _numbers(value, out: list[float]) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        out.append(float(value))
    elif isinstance(value, str):  # "2,050 texts", a command's arguments
        out += [float(m.replace(",", "")) for m in re.findall(r"\d[\d,]*\.?\d*", value) if m[-1] != ","]
    elif isinstance(value, dict):
        for v in value.values():
            _numbers(v, out)
    elif isinstance(value, list):
        for v in value:
            _numbers(v, out)


def _ratios(value, out: list[float]) -> None:
    """a / b for numbers recorded side by side: the values of one object, or of one short list."""
    items = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []
    nums = [float(v) for v in items if isinstance(v, int | float) and not isinstance(v, bool) and v]
    if isinstance(value, dict) or len(nums) < 12:
        out += [a / b for i, a in enumerate(nums) for j, b in enumerate(nums) if i != j]
    for v in items:
        _ratios(v, out)


def _result(name: str) -> tuple[list[float], list[float]]:
    data = json.loads((RESULTS / f"{name}.json").read_text())
    values: list[float] = []
    ratios: list[float] = []
    _numbers(data, values)
    _ratios(data, ratios)
    return values, ratios


def matches(figure: str, unit: str, values: list[float], ratios: list[float]) -> bool:
    """Whether ``figure`` (as written, with its ``unit``) is one of ``values`` at its precision, or
    a unit's scale of one, or (× and %) a ratio of two side by side."""
    decimals = len(figure.split(".")[1]) if "." in figure else 0
    target = float(figure.replace(",", ""))
    unit = unit.strip()
    # a percentage change: of two numbers side by side, or of a recorded ratio (1.053 -> 5.3 %)
    changes = [*ratios, *(v for v in values if 0.5 < v < 2)]
    derived = ratios if "×" in unit else [(r - 1) * 100 for r in changes] + [(1 - r) * 100 for r in changes]
    scales = SCALES.get(unit.split("/")[0].strip(), (1,))
    candidates = [*values, *(derived if unit in ("×", "%") else ())]
    return any(abs(v * k - target) <= 0.5 * 10**-decimals * 1.001 for v in candidates for k in scales)


def passages() -> list[tuple[str, str]]:
    """(where, text) of each paragraph, list item and table row of the published text."""
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    texts = {"CHANGELOG.md (unreleased)": changelog[: changelog.index("\n## [0.")]}
    for path in [
        REPO / "README.md",
        REPO / "benchmarks" / "README.md",
        *sorted((REPO / "docs").rglob("*.md")),
    ]:
        if path.name != "changelog.md":  # the CHANGELOG, included
            texts[str(path.relative_to(REPO))] = path.read_text(encoding="utf-8")
    out = []
    rendered = re.compile(
        r"<!-- figures: [\w-]+ -->.*?<!-- /figures -->|<!-- fig: [\w-]+ -->.*?<!-- /fig -->", re.DOTALL
    )
    for where, text in texts.items():
        # a rendered block is checked exactly (test_every_rendered_block_equals_a_fresh_render…)
        text = rendered.sub("", text)
        # a range shares its unit ("1.10–1.40×"); "layerwise 0.2" is a version, not a figure
        text = re.sub(
            r"(\d[\d,.]*)\s?[–-]\s?(\d[\d,.]*)(\s?(?:×|%|s\b|ms\b|MB/s|GB/s))", r"\1\3 – \2\3", text
        )
        text = re.sub(r"layerwise \d+\.\d+(\.\d+)?", "layerwise", text)
        out += [(where, unit) for unit in re.split(r"\n\s*\n|\n(?=\s*[-*|] )", text)]
    return out


def unmatched(text: str) -> tuple[set[str], list[str]]:
    """The result files a passage names, and its figures that none of them holds."""
    names = {n for n in re.findall(r"benchmarks/(?:results/)?(\w+)\.(?:py|json)", text)
             if (RESULTS / f"{n}.json").exists()}  # fmt: skip
    if not names:
        return names, []
    values: list[float] = []
    ratios: list[float] = []
    for name in names:
        v, r = _result(name)
        values += v
        ratios += r
    # code (a command's arguments) and links are not figures
    prose = re.sub(r"`[^`]*`|\([^)]*\.py[^)]*\)|https?://\S+", "", text)
    bad = []
    for m in FIGURE.finditer(prose):
        figure, unit = m.group(1), m.group(2) or ""
        if (unit or "." in figure) and not matches(figure, unit, values, ratios):
            bad.append(figure + unit)
    return names, bad


def test_every_published_figure_is_in_its_result_file():
    problems = []
    checked = 0
    for where, text in passages():
        names, bad = unmatched(text)
        checked += bool(names)
        if bad:
            problems.append(f"{where} ({', '.join(sorted(names))}): {bad} in {text.strip()[:120]!r}")
    assert checked > 80  # the passages that cite a script were found
    assert not problems, "\n".join(problems)


def test_the_figures_check_catches_a_figure_that_differs():
    """The store's cost once read 1.015× in the docs while store_cost.json said 1.035×."""
    cited = "The store's own cost (`python benchmarks/store_cost.py`): **{}** (medians)."
    assert unmatched(cited.format("1.035×"))[1] == []
    assert unmatched(cited.format("1.015×"))[1] == ["1.015×"]
    assert unmatched("A 100-node run, on paper: 2.2B tokens in 1.1 h.")[1] == []  # no script named


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
