"""The README's and the docs pages' code is true (docs/design.md §8): every ```python block compiles and
names nothing undefined (blocks may build on earlier blocks of the same page), the blocks marked
``<!-- run -->`` run against a real server on port 0, every ``flightfeed SUB --flag`` a page shows is a
flag of that subcommand's parser, the README's commands are the CLI's, and the architecture page names
every room."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from flightfeed.server.cli import SUBCOMMANDS
from flightfeed.server.testing import running_server
from tests.support.datasets import write_dataset
from tests.support.token_corpus import write_token_corpus
from tools.mkdocs_hooks import subcommand_parser
from tools.module_map import rooms

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_MARK = "<!-- run -->"
#: the location runnable blocks name; the test swaps in its server's
DOC_LOCATION = "grpc://127.0.0.1:8815"
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the block's first code line
    lang: str
    code: str
    runnable: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        out.append(Block(page, i + 2, m.group(1), "\n".join(lines[i + 1 : j]) + "\n", before == RUN_MARK))
        i = j + 1
    return out


def python_blocks(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.lang == "python"]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_python_blocks_compile(page: Path) -> None:
    for block in python_blocks(page):
        try:
            compile(block.code, block.where, "exec")
        except SyntaxError as exc:
            pytest.fail(f"{block.where}: the python block does not compile: {exc}")


def undefined_names(code: str) -> list[tuple[int, str]]:
    """(line, message) of every undefined name in ``code`` (ruff's F821, as pyflakes reports it)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--isolated",
            "--no-cache",
            "--select",
            "F821",
            "--output-format",
            "json",
            "--stdin-filename",
            "block.py",
            "-",
        ],
        input=code,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    found = json.loads(proc.stdout or "[]")
    return [(int(f["location"]["row"]), str(f["message"])) for f in found]


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_python_blocks_name_nothing_undefined(page: Path) -> None:
    """All python blocks of a page in order, as one module: a block may use what an earlier one defined."""
    code = ""
    starts: list[tuple[int, Block]] = []  # (first line in the joined module, block)
    for block in python_blocks(page):
        starts.append((code.count("\n") + 1, block))
        code += block.code
    problems = []
    for row, message in undefined_names(code):
        first, block = max((s for s in starts if s[0] <= row), key=lambda s: s[0])
        problems.append(f"{page_id(page)}:{block.line + row - first}: {message}")
    assert not problems, "python blocks use names nothing defines:\n" + "\n".join(problems)


def runnable() -> Iterator[Block]:
    for page in PAGES:
        yield from (b for b in python_blocks(page) if b.runnable)


@pytest.fixture(scope="module")
def doc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real server on port 0 serving what the runnable blocks read: ``train`` (image, label, ...)
    and ``web`` (one document of tokens per row)."""
    root = tmp_path_factory.mktemp("doc_data")
    write_dataset(root / "train", [[300, 300], [300]])
    write_token_corpus(root / "web", [[400, 400], [400]], max_len=120)
    with running_server({"train": str(root / "train"), "web": str(root / "web")}) as server:
        yield server.location


def test_some_blocks_are_runnable() -> None:
    assert len(list(runnable())) >= 3, f"mark the quick starts with {RUN_MARK} so they are run"


@pytest.mark.parametrize("block", list(runnable()), ids=lambda b: b.where)
def test_runnable_blocks_run(block: Block, doc_server: str, tmp_path: Path) -> None:
    """Each marked block, in a fresh process (gRPC and fork: as a user's script would), against the server."""
    assert DOC_LOCATION in block.code, f"{block.where}: a runnable block reads from {DOC_LOCATION}"
    code = block.code.replace(DOC_LOCATION, doc_server)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False, timeout=240
    )
    assert proc.returncode == 0, f"{block.where}: the block failed:\n{proc.stderr[-3000:]}"


SHELL = ("bash", "sh", "console")
COMMAND = re.compile(r"flightfeed ([a-z]+)((?:[^`\n]|\\\n)*)")


def command_lines(page: Path) -> Iterator[tuple[str, str, str]]:
    """(where, subcommand, the rest of the line) of every ``flightfeed SUB ...`` in shell blocks and
    inline code."""
    text = page.read_text(encoding="utf-8")
    for block in blocks(page):
        if block.lang in SHELL:
            for m in COMMAND.finditer(block.code.replace("\\\n", " ")):
                yield block.where, m.group(1), m.group(2).split("#")[0].split("&&")[0]
    for span in re.finditer(r"`(flightfeed [a-z]+[^`]*)`", text):
        inline = COMMAND.match(span.group(1))
        if inline is not None:
            line = text.count("\n", 0, span.start()) + 1
            yield f"{page_id(page)}:{line}", inline.group(1), inline.group(2)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_documented_flags_exist(page: Path) -> None:
    """A flag a page shows for ``flightfeed SUB`` is one of SUB's flags (what ``--help`` prints)."""
    flags: dict[str, set[str]] = {}
    problems = []
    for where, sub, rest in command_lines(page):
        if sub not in SUBCOMMANDS:
            problems.append(f"{where}: flightfeed {sub}: no such command (commands: {', '.join(SUBCOMMANDS)})")
            continue
        if sub not in flags:
            flags[sub] = {s for a in subcommand_parser(sub)._actions for s in a.option_strings}
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
            if flag not in flags[sub]:
                problems.append(f"{where}: flightfeed {sub} has no flag {flag}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_shell_lines_paste(page: Path) -> None:
    """A shell block's line runs as pasted: no ``[--flag]`` usage brackets (they are not shell)."""
    problems = [
        f"{page_id(page)}:{block.line + i}: {line.strip()}"
        for block in blocks(page)
        if block.lang in SHELL
        for i, line in enumerate(block.code.splitlines())
        if re.search(r"\[--?[a-z]", line.split("#")[0])
    ]
    assert not problems, "usage brackets in shell lines (write the flag, or move it into a comment):\n" + "\n".join(
        problems
    )


def test_readme_commands_are_the_cli() -> None:
    """The README's one-line-per-command table names each subcommand once, and only those."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^\| `flightfeed ([a-z]+)", table, flags=re.M)
    assert named == list(SUBCOMMANDS)


def test_architecture_names_every_room() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [str(r) for r in rooms() if f"`{r}/`" not in page]
    assert not missing, f"docs/architecture.md misses rooms {missing}: run python tools/module_map.py --write"


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move detail into a docs/ page"
