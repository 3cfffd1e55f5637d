"""The pure model: the job record and its life cycle, resources, scheduling, topology, formats.

No I/O and no clock of its own: everything here is a function of its arguments,
unit-tested directly and type-checked strictly (mypy --strict by directory).
Imported by every side; imports nothing of theirs (tests/unit/test_layout.py).
"""
