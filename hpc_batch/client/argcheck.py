"""Command lines docopt would misread, caught before it parses them (pure: no I/O).

docopt reads any word that starts with ``-`` and holds a letter as options, so
``dispatch job 7 max-time add -5m`` fails as a usage error that names nothing.
Each check here says what is wrong with the word instead.
"""

from ..bounds import shown


class BadArgs(ValueError):
    """A command line refused before docopt sees it; the message names the word and the fix."""


def check(args: "list[str]", usages: "dict[str, str]") -> None:
    """Raise BadArgs for a command line (the words after ``dispatch``) docopt would misread;
    *usages* are the verbs' usage texts (their Options: sections say which flags take a value)."""
    if args[:1] == ["job"]:
        _job_duration(args)
    if args and args[0] in usages:
        _flag_values(args, usages[args[0]])


def _flag_values(args: "list[str]", usage: str) -> None:
    # A flag that takes a value, with none (last, before "--", or "--flag="), and a switch given
    # one ("--json=yes"): docopt says only "missing or invalid arguments", or takes the switch.
    from .argscan import options
    table = {name: opt for opt in options(usage) for name in opt.names if name.startswith("--")}
    metavars = _metavars(usage)
    i = 1
    while i < len(args):
        word = args[i]
        if word == "--" or (args[0] == "new" and not word.startswith("-")):
            return                  # the command (dispatch new's) starts here
        name, eq, value = word.partition("=")
        opt = table.get(name)
        if name == "--benchmark" and not eq:
            pass                    # its value may be left out (warn): bare_benchmark's business
        elif opt is not None and opt.takes_value:
            if (eq and not value) or (not eq and (i + 1 >= len(args) or args[i + 1] == "--")):
                raise BadArgs(f"{name} needs a value, e.g. {name} {EXAMPLES.get(name, metavars.get(name, 'VALUE'))} "
                              f"(see dispatch {args[0]} --help)")
            i += 0 if eq else 1
        elif opt is not None and eq:
            raise BadArgs(f"{name} takes no value: give {name} alone (see dispatch {args[0]} --help)")
        elif opt is None and name.startswith("--") and name != "--" and not any(n.startswith(name) for n in table):
            # (an abbreviation of one, --exclu, is docopt's to take)
            raise BadArgs(f"unknown option {shown(name)}: dispatch {args[0]} --help lists its options")
        i += 1


# Examples of a good value, where the metavar alone says too little.
EXAMPLES = {"--cpu": "4", "--max-mem": "8G", "--max-time": "2h", "--gpu-cores": "1", "--name": "prep",
            "--after": "12", "--after-ok": "12", "--array": "1-10", "--output": "logs/", "--limit": "20",
            "--since": "7d", "--until": "2026-12-01", "--state": "failed", "--verdict": "clean"}


def _metavars(usage: str) -> "dict[str, str]":
    """Each option's metavar as its usage text names it (``--cpu N``: N)."""
    found = {}
    for line in usage.split("Options:", 1)[-1].splitlines():
        words = line.strip().split("  ")[0].replace(",", " ").replace("=", " ").split()
        meta = [w for w in words if not w.startswith("-")]
        if words and words[0].startswith("-") and meta:
            found.update({w: meta[0] for w in words if w.startswith("--")})
    return found


def _job_duration(args: "list[str]") -> None:
    # dispatch job <job> max-time (set|add) <duration>: a negative duration reads as options.
    if len(args) == 5 and args[2] == "max-time" and args[3] in ("set", "add") and args[4].startswith("-") \
            and args[4] not in ("-h", "--help"):
        raise BadArgs(f"max-time {args[3]} {shown(args[4])}: a duration is longer than zero seconds "
                      f"(3600, 45m, 2h, 1h30m, 1d); to shorten a job's max time, set the new one: "
                      f"dispatch job {shown(args[1])[1:-1]} max-time set 30m")
