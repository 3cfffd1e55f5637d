"""A command line cut to a bounded size, for records that must not carry a whole job.

A job's command may be up to ``--max-job-size`` (1 MiB by default); what
is kept of it for people (history lines) is its first ``COMMAND_BYTES``,
with the full length alongside, so a cut is never mistaken for the whole.
"""

import shlex

COMMAND_BYTES = 4096   # 4 KiB of a command is plenty to recognise it


def cut_command(argv: list[str], limit: int = COMMAND_BYTES) -> tuple[str, int]:
    """The command as ``list`` shows it (shell-quoted), cut to *limit* UTF-8 bytes, and its full length in bytes.

    The cut falls on a character boundary, so the text stays valid; a
    length larger than the text's own says it was cut.
    """
    text = shlex.join(argv)
    raw = text.encode("utf-8", "surrogatepass")   # argv may carry lone surrogates (undecodable bytes)
    if len(raw) <= limit:
        return text, len(raw)
    for end in range(limit, max(limit - 4, -1), -1):   # back off a character cut in half (at most 3 bytes)
        try:
            return raw[:end].decode("utf-8", "surrogatepass"), len(raw)
        except UnicodeDecodeError:
            continue
    return raw[:limit].decode("utf-8", "replace"), len(raw)   # not reached: UTF-8 resyncs within 4 bytes
