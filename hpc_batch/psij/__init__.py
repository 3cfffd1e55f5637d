"""hpc-batch as a PSI/J executor (the ``[psij]`` extra): a client like ``dispatch``.

Imports the core and the client's connection, never the daemon.
"""
