"""docopt's answer for the argument lists people type, without importing docopt.

docopt, with the ``re`` and ``typing`` it imports, is most of a ``dispatch``
start-up, and ``dispatch new`` runs once per submitted job. For the common
shapes this builds exactly the dict docopt would, from the same usage text,
so the text stays the one definition of the flags and their defaults:
``scan`` for ``new`` (known long options, then the command), ``scan_flags``
for ``list`` (its flags and job words, in any order). Anything else (help,
short options, abbreviations, a repeated option, an option after the
command without ``--``) gets None, and the caller asks docopt, which gives
the result or the usage error. Pure: no I/O.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Option:
    """One line of an Options: section: its names, whether it takes a value, its default."""

    __slots__ = ("names", "takes_value", "default")

    def __init__(self, names: "list[str]", takes_value: bool, default: "str | None"):
        self.names = names
        self.takes_value = takes_value
        self.default = default

    @property
    def key(self) -> str:
        """The key docopt gives it: the long name when there is one."""
        longs = [n for n in self.names if n.startswith("--")]
        return longs[0] if longs else self.names[0]


def options(usage: str) -> "list[Option]":
    """The options described in *usage*'s ``Options:`` section, docopt's way.

    A line whose first non-blank character is ``-`` starts an option; the
    words before the first double space are its names and argument; the
    description (continuation lines included) may hold ``[default: X]``.
    """
    found: list[Option] = []
    descriptions: list[str] = []
    in_section = False
    for line in usage.split("\n"):
        if line.strip().lower() == "options:":
            in_section = True
            continue
        if not in_section:
            continue
        text = line.strip()
        if text.startswith("-"):
            spec, _, desc = text.partition("  ")
            words = spec.replace(",", " ").replace("=", " ").split()
            found.append(Option([w for w in words if w.startswith("-")],
                                any(not w.startswith("-") for w in words), None))
            descriptions.append(desc)
        elif text and found:
            descriptions[-1] += " " + text
    for opt, desc in zip(found, descriptions):
        lowered = desc.lower()
        at = lowered.find("[default:")
        if opt.takes_value and at >= 0:
            end = desc.find("]", at)
            if end > at:
                opt.default = desc[at + len("[default:"):end].strip()
    return found


def scan(argv: "list[str]", verb: str, usage: str, command_key: str = "<command>") -> "dict[str, Any] | None":
    """docopt(*usage*, argv) for ``<verb> [options] [--] <command>...``, or None to ask docopt."""
    if not argv or argv[0] != verb:
        return None
    table = options(usage)
    by_name = {name: opt for opt in table for name in opt.names}
    given: dict[str, Any] = {}
    dashdash = False
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            dashdash = True
            i += 1
            break
        if not word.startswith("--"):
            if word.startswith("-") and word != "-":
                return None          # short options (-h) are docopt's business
            break                    # the command starts here
        name, eq, value = word.partition("=")
        opt = by_name.get(name)
        if opt is None or opt.key in given or opt.key == "--help":
            return None
        if opt.takes_value:
            if not eq:
                i += 1
                if i >= len(argv) or argv[i] == "--":
                    return None
                value = argv[i]
            given[opt.key] = value
        elif eq:
            return None
        else:
            given[opt.key] = True
        i += 1
    command = argv[i:]
    if not command:
        return None
    if not dashdash and any(w.startswith("-") and w != "-" for w in command):
        return None                  # docopt would read these as options: let it
    result: dict[str, Any] = {opt.key: (given.get(opt.key, opt.default) if opt.takes_value
                                        else given.get(opt.key, False)) for opt in table}
    result.update({verb: True, "--": dashdash, command_key: command})
    return result


def scan_flags(argv: "list[str]", verb: str, usage: str, words_key: str) -> "dict[str, Any] | None":
    """docopt(*usage*, argv) for ``<verb> [--flag]... [--opt VALUE]... [<word>...]``, or None to
    ask docopt.

    For ``list``: each long option at most once, anywhere, a valued one as ``--opt VALUE`` or
    ``--opt=VALUE``; every other word is one of *words_key*. A word that starts with ``-`` (help,
    ``--``, an abbreviation, ``--flag=x``, a negative number, a value that looks like an option)
    is left to docopt.
    """
    if not argv or argv[0] != verb:
        return None
    table = options(usage)
    flags = {name: opt for opt in table if opt.key != "--help" for name in opt.names if name.startswith("--")}
    given: dict[str, Any] = {}
    words: list[str] = []
    rest = iter(argv[1:])
    for word in rest:
        if not word.startswith("-"):
            words.append(word)
            continue
        name, eq, value = word.partition("=")
        opt = flags.get(name)
        if opt is None or opt.key in given or (eq and not opt.takes_value):
            return None
        if opt.takes_value and not eq:
            value = next(rest, "-")
        if opt.takes_value and (not value or value.startswith("-")):
            return None
        given[opt.key] = value if opt.takes_value else True
    result: dict[str, Any] = {opt.key: given.get(opt.key, opt.default if opt.takes_value else False)
                              for opt in table}
    result.update({verb: True, words_key: words})
    return result
