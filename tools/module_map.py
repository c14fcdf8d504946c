"""The module map of ``docs/architecture.md``: every room (package) and module of the three code roots,
each with the first line of its docstring.

    python tools/module_map.py           # print the map
    python tools/module_map.py --write   # rewrite it between the markers in docs/architecture.md

``tests/architecture/test_doc_blocks.py`` checks that every room is on the page.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE_ROOTS = ("proto_schemas/flightfeed/wire", "server/flightfeed/server", "client/flightfeed/client")
BEGIN, END = "<!-- module-map:begin -->", "<!-- module-map:end -->"
PAGE = ROOT / "docs" / "architecture.md"


def rooms() -> list[Path]:
    """Every package folder of the three code roots, relative to the repository root."""
    found = {p.parent.relative_to(ROOT) for r in CODE_ROOTS for p in (ROOT / r).rglob("*.py")}
    return sorted(found)


def first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    line = " ".join(doc.strip().split("\n\n")[0].split())
    return line.replace("|", "\\|")


def module_map() -> str:
    out: list[str] = []
    for room in rooms():
        files = sorted(p for p in (ROOT / room).glob("*.py") if not p.name.endswith("_pb2.py"))
        out += [f"### `{room}/`", "", "| module | what |", "|---|---|"]
        out += [f"| `{p.name}` | {first_line(p)} |" for p in files]
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    text = module_map()
    if "--write" not in argv:
        print(text)
        return 0
    page = PAGE.read_text(encoding="utf-8")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(f"{head}{BEGIN}\n\n{text}\n{END}{tail}", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
