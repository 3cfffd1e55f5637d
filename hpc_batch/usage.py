"""Usage errors from docopt, said in one line a person can act on."""

import re
import sys

_WORD = re.compile(r"(?:Option|Argument|Command)\([^,]*, '([^']*)'")


def usage_block(doc: str) -> str:
    """The ``Usage:`` section of a docopt text."""
    m = re.search(r"^Usage:.*?(?=\n\s*\n|\Z)", doc, re.S | re.M)
    return m.group(0) if m else doc.strip()


def explain(prog: str, exc: BaseException, doc: str, missing: str = "missing or invalid arguments",
            first: str | None = None) -> None:
    """Print what was wrong (the offending word when docopt names one), then the usage.

    docopt reports the command word itself as "unmatched" when what is
    really wrong is a missing argument: *first* is that word, and then the
    *missing* text is the better explanation.
    """
    m = _WORD.search(str(exc))
    what = f"unexpected argument {m.group(1)!r}" if m and m.group(1) != first else missing
    print(f"{prog}: {what}", file=sys.stderr)
    print(usage_block(doc), file=sys.stderr)
