"""The shell blocks of the docs that a test runs: fenced blocks tagged ``sh runnable``.

The tag goes in the fence's info string (```` ```sh runnable ````): it travels
with the block when the block is moved or edited, and renderers read only its
first word (``sh``), so readers see an ordinary shell block. Which files are
checked, and how the blocks run, is tests/integration/test_doc_blocks.py's
business; this module only finds them (pure, tested in
tests/unit/test_docblocks.py).
"""

from dataclasses import dataclass

LANGUAGES = ("sh", "bash")
MARK = "runnable"
FENCE = "```"


@dataclass(frozen=True)
class Block:
    """One runnable block: the line its opening fence is on (from 1), and its text."""

    line: int
    text: str


def runnable_blocks(markdown: str) -> list[Block]:
    """Every ``sh runnable`` (or ``bash runnable``) fenced block of *markdown*, in order.

    Raises ValueError for a fence left open, naming its line: a block that
    silently swallowed the rest of a page would run the wrong text.
    """
    blocks: list[Block] = []
    opened: int | None = None
    runnable = False
    body: list[str] = []
    for number, line in enumerate(markdown.splitlines(), 1):
        stripped = line.strip()
        if opened is None:
            if stripped.startswith(FENCE):
                info = stripped[len(FENCE):].split()
                opened, body = number, []
                runnable = bool(info) and info[0] in LANGUAGES and MARK in info[1:]
            continue
        if stripped == FENCE:
            if runnable:
                blocks.append(Block(opened, "\n".join(body) + "\n"))
            opened = None
            continue
        body.append(line)
    if opened is not None:
        raise ValueError(f"line {opened}: a ``` fence is never closed")
    return blocks
