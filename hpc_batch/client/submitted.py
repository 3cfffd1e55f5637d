"""What ``dispatch new`` says about a submitted job's memory (pure).

On every submit's path: it imports no more than ``dispatch`` already has (not typing, a few ms).
"""

from ..core.sizes import format_mem


def memory_words(reply: dict, each: bool = False) -> str:
    """The memory part of ``dispatch new``'s line, from the daemon's ``new`` reply.

    ``memory budget 2G (requested)``, ``... each`` for a bulk submit. A daemon
    run with ``--no-cgroups`` (``mem_enforced`` false) limits no job's memory:
    it only counts the figure against one machine-wide pool when it places
    jobs, so the line does not call it a budget.
    """
    mem = format_mem(reply["mem"]) + (" each" if each else "")
    how = "assigned by default" if reply.get("mem_assigned") else "requested"
    if reply.get("mem_enforced", True):   # a reply without it comes from a daemon that always enforced
        return f"memory budget {mem} ({how})"
    return f"memory {mem} ({how}), not enforced: the daemon runs with --no-cgroups"
