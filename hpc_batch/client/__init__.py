"""``dispatch``: the command line, its connection to the daemon, and what it prints.

Import-light (a submit starts at about the interpreter's own floor): imports
the core and the wire, never the daemon.
"""
