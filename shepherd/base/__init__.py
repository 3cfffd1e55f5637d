"""The standard-library base that the shepherd, its record and hpc_batch all import.

Standard library only, imported by each shepherd (so every module here is
paid for in a job's start-up), and nothing here imports the supervisor or
the record. Its modules import each other relatively: ``base`` is a package
whether the shepherd runs as a file (found top-level) or as ``shepherd.base``.
"""
