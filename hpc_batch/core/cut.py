"""The cut command: how much of a job's command line a summary carries.

A job's argv may take up to ``--max-job-size`` (1 MiB by default), and a bulk
submit repeats it in every element. ``dispatch list``, ``info.json``, the
history lines and the daemon's log carry at most ``COMMAND_CUT`` characters
of it, with the full length beside it (``command_len``), so no summary costs
more than a page's share however long the command; ``dispatch show`` keeps
the whole argv. One definition here, used by all of them.

No ``shlex``: it imports ``re``, and ``dispatch list`` reads ``one_line``
from here; ``join`` below is ``shlex.join``'s quoting, checked against it.
"""

COMMAND_CUT = 4096     # characters of a command a summary carries
MARK = "..."           # ends a command that was cut

# The last argv cut and its result: the elements of a bulk submit share their argv,
# so one (O(size)) join serves them all, and they share the small result too.
_memo: tuple[list[str] | tuple[str, ...], tuple[str, int]] | None = None


# Characters shlex.quote leaves bare (its ASCII word characters and @%+=:,./-).
_SAFE = b"%+,-./0123456789:=@ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"


def quote(word: str) -> str:
    """*word* as ``shlex.quote`` writes it: bare when safe, else in single quotes."""
    if not word:
        return "''"
    if word.isascii() and not word.encode().translate(None, _SAFE):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def join(argv: list[str] | tuple[str, ...]) -> str:
    """``shlex.join(argv)``: the command line as a shell shows it."""
    return " ".join(quote(word) for word in argv)


def cut_text(text: str, limit: int = COMMAND_CUT) -> str:
    """*text*, or its first characters ending in MARK when longer than *limit*."""
    return text if len(text) <= limit else text[:limit - len(MARK)] + MARK


def cut_command(argv: list[str] | tuple[str, ...]) -> tuple[str, int]:
    """``(command, command_len)``: the command line as a shell shows it, cut to COMMAND_CUT
    characters, and the length of the whole line."""
    global _memo
    if _memo is not None and (_memo[0] is argv or _memo[0] == argv):
        return _memo[1]
    full = join(argv)
    got = (cut_text(full), len(full))
    _memo = (argv, got)
    return got


def one_line(text: str) -> str:
    """*text* with control characters escaped, so every job stays on one row."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
