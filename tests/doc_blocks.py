"""The examples of docs/clients.md, extracted so that tests run them as written: each fenced
code block follows a marker ``<!-- example NAME runs=WHERE -->`` (WHERE: ``vm``, the kernel
rig's guest; ``host``, the test host). Running one replaces ``HOST`` and the port ``20490``
with the server's, nothing else."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CLIENTS_DOC = Path(__file__).resolve().parent.parent / "docs" / "clients.md"
WHERE = ("vm", "host")
DOC_PORT = "20490"
_MARKER = re.compile(r"<!-- example (?P<name>[a-z0-9-]+) runs=(?P<where>[a-z]+) -->\n")
_FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<code>.*?)^```$", re.M | re.S)


@dataclass(frozen=True)
class DocBlock:
    name: str
    where: str  # "vm" or "host"
    lang: str  # "sh" or "python"
    code: str

    def for_server(self, host: str, port: int) -> str:
        """The code with the doc's server (HOST, port 20490) replaced by this one."""
        return re.sub(r"\bHOST\b", host, self.code).replace(DOC_PORT, str(port))


def doc_blocks(path: Path = CLIENTS_DOC) -> list[DocBlock]:
    """Every fenced block of the doc, in order; each must follow its marker (an example no
    test runs is an error, not a skip)."""
    text = path.read_text()
    blocks, names = [], set()
    for fence in _FENCE.finditer(text):
        before = text[: fence.start()].rstrip(" \n") + "\n"
        marker = _MARKER.search(before, max(0, len(before) - 200))
        line = text.count("\n", 0, fence.start()) + 1
        if marker is None or marker.end() != len(before):
            raise ValueError(f"{path.name}:{line}: a code block without an example marker")
        name, where = marker["name"], marker["where"]
        if where not in WHERE or name in names or fence["lang"] not in ("sh", "python"):
            raise ValueError(f"{path.name}:{line}: example {name!r} runs={where} ({fence['lang']})")
        names.add(name)
        blocks.append(DocBlock(name, where, fence["lang"], fence["code"]))
    return blocks
