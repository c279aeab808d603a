"""Every Python and shell example in the README and the docs runs: docs that cannot rot.

Each page runs in a fresh folder holding the files its examples name (examples/, corpus.parquet,
data/*.parquet, the UD EWT excerpts). A page's Python blocks run in order in one namespace, as in a
notebook; each shell block runs as one bash script (``set -eo pipefail``), with the installed
``layerwise`` on PATH.

A block may be marked with an HTML comment on the line before it:

    <!-- docs-test: server -->  its first command serves until stopped: it starts in the background,
                                the rest of the block runs once /health answers, then it is stopped
    <!-- docs-test: server-up -->  the same, but the server keeps serving for the page's later
                                blocks (a Python client after the shell that started it), until
                                the page ends
    <!-- docs-test: netns -->   it opens network listeners (Ray): it runs in a network namespace
                                with only loopback (as root, like the Ray tests); a Python block
                                marked so runs on its own in a fresh interpreter there
    <!-- docs-test: installed -->  an install command: what follows its last `pip install … &&`
                                runs, with the layerwise installed for the tests
    <!-- docs-test: skip REASON -->  not run here (a GPU, a model from the hub, or the test command
                                itself), with the reason

Pages listed in NOT_YET_RUNNABLE are collected and skipped with the reason given there.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NOT_YET_RUNNABLE: dict[str, str] = {}  # page -> why its examples cannot run here yet
FENCE = re.compile(
    r"(?:<!-- docs-test: (?P<mark>[^>]*?) -->\n)?```(?P<lang>python|bash)\n(?P<code>.*?)```", re.S
)
SERVER_PORT = 8000


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    mark: str
    line: int


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    return [
        Block(m["lang"], m["code"], (m["mark"] or "").strip(), text.count("\n", 0, m.start()) + 1)
        for m in FENCE.finditer(text)
    ]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def prepare(folder: Path, *, bare: bool = False) -> None:
    """The files the examples name, in the folder the page runs in. ``bare``: only what a clone of
    the repository holds (the README runs as written on a fresh clone: #46, 21)."""
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.parquet as pq
    import zstandard

    shutil.copytree(ROOT / "examples", folder / "examples")
    shutil.copytree(ROOT / "benchmarks" / "data", folder / "benchmarks" / "data")
    if bare:
        return
    lines = (ROOT / "tests" / "data" / "ud_ewt" / "en_ewt-ud-dev.sentences.txt").read_text().splitlines()
    every = [s for s in lines if s.strip()]  # 500 UD EWT dev sentences
    (folder / "corpus.txt").write_text("\n".join(every) + "\n", encoding="utf-8")
    # one sentence per line, a blank line between documents (the pretraining format): UD EWT dev
    docs = gzip.decompress((ROOT / "benchmarks/data/ud_ewt/en_ewt-ud-dev.docs.txt.gz").read_bytes())
    (folder / "documents.txt").write_bytes(docs)
    probing_files(folder, every)
    sentences = every[:60]
    ids = [f"d{i}" for i in range(len(sentences))]
    pq.write_table(pa.table({"doc_id": ids, "text": sentences, "body": sentences}), folder / "corpus.parquet")
    (folder / "data").mkdir()
    table = pa.table({"doc_id": ids, "body": sentences})
    pq.write_table(table.slice(0, 30), folder / "data" / "part-0.parquet")
    pq.write_table(table.slice(30), folder / "data" / "part-1.parquet")
    pq.write_table(pa.table({"tokens": [s.split() for s in sentences]}), folder / "tokens.parquet")
    pairs = pa.table({"q": sentences[:20], "a": sentences[20:40]})
    pa.csv.write_csv(pairs, folder / "pairs.csv")
    records = "".join(json.dumps({"text": s}) + "\n" for s in sentences).encode()
    (folder / "corpus.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(records))
    with gzip.open(folder / "corpus.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write("\n".join(sentences) + "\n")


def probing_files(folder: Path, sentences: list[str]) -> None:
    """Stand-ins in the probing tasks' formats (CoNLL-2003 is not ours to ship): capitalised words
    after the first are tagged as names; a sentence's label is whether it is short."""
    sentences = [s for s in sentences if '"' not in s and "\t" not in s]  # no quoting in the tables

    def conll(part: list[str]) -> str:
        out = ["-DOCSTART- -X- -X- O", ""]
        for sentence in part:
            for k, word in enumerate(sentence.split()):
                tag = "B-PER" if k and word[:1].isupper() else "O"
                out.append(f"{word} NN I-NP {tag}")
            out.append("")
        return "\n".join(out) + "\n"

    (folder / "eng.train").write_text(conll(sentences[:300]), encoding="utf-8")
    (folder / "eng.testa").write_text(conll(sentences[300:400]), encoding="utf-8")
    for name, part in (("train.tsv", sentences[:200]), ("dev.tsv", sentences[200:300])):
        rows = [f"{s}\t{'short' if len(s.split()) < 10 else 'long'}" for s in part]
        (folder / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    rows = [
        f"{a}\t{b}\t{(len(a) % 5) / 4:.2f}" for a, b in zip(sentences[:100], sentences[100:200], strict=True)
    ]
    (folder / "sts.tsv").write_text(
        "sentence1\tsentence2\tscore\n" + "\n".join(rows) + "\n", encoding="utf-8"
    )


def shell_commands(code: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines left out."""
    commands, current = [], ""
    for line in code.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\") + (" " if line.endswith("\\") else "")
        if not line.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def run_shell(command: str, folder: Path, env: dict, *, netns: bool = False) -> None:
    check_curl(command)
    if netns:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            pytest.skip("a network namespace needs root and unshare (Ray opens listeners)")
        command = f"ip link set lo up && {command}"
        argv = ["unshare", "-n", "bash", "-c", f"set -eo pipefail; {command}"]
    else:
        argv = ["bash", "-c", f"set -eo pipefail; {command}"]
    run = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"$ {command}\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"


def check_curl(command: str) -> None:
    """A `curl` that exits 0 on an HTTP error status lets a failing example pass: every curl in the
    docs fails on one (``-f``, as in ``curl -fsS``)."""
    for call in re.findall(r"\bcurl\s+([^|;&]*)", command):
        flags = "".join(re.findall(r"(?:^|\s)-([a-zA-Z]+)", call))
        if "f" not in flags and "--fail" not in call:
            raise AssertionError(
                f"`curl {call.strip()}`: add -f (curl -fsS) so that an HTTP error fails the example"
            )


def start_server(command: str, folder: Path, env: dict) -> subprocess.Popen:
    """``command`` started in the background, once /health answers on the docs' port."""
    server = subprocess.Popen(
        ["bash", "-c", f"exec {command}"], cwd=folder, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{SERVER_PORT}/health", timeout=2):
                return server
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                stop_server(server)
                out = server.stdout.read() if server.stdout else ""
                raise AssertionError(f"$ {command}\ndid not start serving:\n{out[-3000:]}") from None
            time.sleep(0.5)


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=60)


def serve_then(commands: list[str], folder: Path, env: dict) -> None:
    server = start_server(commands[0], folder, env)
    try:
        for command in commands[1:]:
            run_shell(command, folder, env)
    finally:
        stop_server(server)


def run_python_in_netns(code: str, where: str, folder: Path, env: dict) -> None:
    script = folder / f"block-{where.rsplit(':', 1)[-1]}.py"
    script.write_text(code, encoding="utf-8")
    run_shell(f"{shlex.quote(sys.executable)} {shlex.quote(script.name)}", folder, env, netns=True)


def _exclusive(page: Path):
    """A page that serves on SERVER_PORT or starts Ray runs on one pytest-xdist worker with the other
    such tests (``--dist loadgroup``), never beside them: one port 8000, one Ray at a time."""
    marks = {block.mark for block in blocks(page)}
    shared = marks & {"server", "server-up", "netns"}
    return pytest.param(page, marks=pytest.mark.xdist_group("exclusive")) if shared else page


@pytest.mark.slow
@pytest.mark.parametrize("page", [_exclusive(page) for page in PAGES], ids=page_id)
def test_examples_run(page: Path, tmp_path: Path) -> None:
    found = blocks(page)
    if not found:
        pytest.skip("no Python or shell examples")
    if page_id(page) in NOT_YET_RUNNABLE:
        pytest.skip(NOT_YET_RUNNABLE[page_id(page)])
    prepare(tmp_path, bare=page == ROOT / "README.md")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.update(HF_HUB_OFFLINE="1", NO_COLOR="1", RAY_USAGE_STATS_ENABLED="0")
    namespace: dict = {"__name__": "__docs__"}
    servers: list[subprocess.Popen] = []  # the page's servers kept up for its later blocks
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        for block in found:
            where = f"{page_id(page)}:{block.line}"
            if block.mark.startswith("skip"):
                continue  # said on the page; the reason is the mark's text
            if block.lang == "python" and block.mark == "netns":
                run_python_in_netns(block.code, where, tmp_path, env)
                continue
            if block.lang == "python":
                try:
                    exec(compile(block.code, where, "exec"), namespace)
                except Exception as exc:
                    raise AssertionError(f"{where}: {type(exc).__name__}: {exc}") from exc
                continue
            commands = shell_commands(block.code)
            if block.mark == "installed":  # what follows the install, with the tests' layerwise
                commands = [re.split(r"pip install [^&]*&&", c)[-1].strip() for c in commands]
                commands = [c for c in commands if not c.startswith(("pip install", "python3 -m venv"))]
            if block.mark == "server":
                serve_then(commands, tmp_path, env)
            elif block.mark == "server-up":
                servers.append(start_server(commands[0], tmp_path, env))
                for command in commands[1:]:
                    run_shell(command, tmp_path, env)
            elif commands:  # one shell for the block: a variable set on one line is there on the next
                run_shell("\n".join(commands), tmp_path, env, netns=block.mark == "netns")
    finally:
        os.chdir(here)
        for server in servers:
            stop_server(server)


def test_a_curl_without_fail_cannot_pass() -> None:
    check_curl("curl -fsS 127.0.0.1:8000/health | head")
    check_curl("curl --fail -s x")
    with pytest.raises(AssertionError, match="add -f"):
        check_curl("layerwise serve & curl -s 127.0.0.1:8000/v1/embeddings -d '{}'")


def test_the_collector_finds_the_readme_tour() -> None:
    """The collector itself: the README's blocks are found, with their marks."""
    found = blocks(ROOT / "README.md")
    assert sum(b.lang == "python" for b in found) >= 1
    assert {b.mark for b in found} >= {"server", "netns"}
    assert shell_commands("a \\\n  b\n# note\n\nc  # trailing\n") == ["a    b", "c  # trailing"]
