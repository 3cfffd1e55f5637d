"""Array elements by name, as Slurm writes them: ``6_3`` and ``6_*`` (pure; cheap to import).

An array is the jobs of one bulk submit (``--array`` or ``--commands``); its
id is its first job's id, and each element has the index it was submitted
with (``--array 0-98:2``'s 0, 2, ..., or a ``--commands`` line number).
``6_3`` names the element of array 6 whose index is 3, and ``6_*`` the whole
array. Plain ``6`` stays the job with id 6 (the array's first element): a
word names one job or one array, never "whichever you meant".

A word made only of digits and ``_`` (with at least one of each) is always
read as an element reference, so that ``6_`` or ``_3`` are refused as
malformed instead of looked up as job names; no job name may have that shape.
"""

from __future__ import annotations

from .. import bounds

WHOLE = "*"
FORMS = "ARRAY_INDEX for one element (6_3) or ARRAY_* for the whole array (6_*), ARRAY being its first job's id"


class ArrayRef:
    """``first``: the array's id; ``index``: an element's index, or None for the whole array."""

    __slots__ = ("first", "index")

    def __init__(self, first: int, index: int | None):
        self.first, self.index = first, index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ArrayRef) and (self.first, self.index) == (other.first, other.index)

    def __hash__(self) -> int:
        return hash((self.first, self.index))

    def __repr__(self) -> str:
        return f"ArrayRef({self.first}, {self.index})"

    def __str__(self) -> str:
        return element_name(self.first, WHOLE if self.index is None else self.index)


def element_name(first: int, index: int | str) -> str:
    """The one spelling of an element (``6_3``) or a whole array (``6_*``) in every output."""
    return f"{first}_{index}"


def looks_like(text: str) -> bool:
    """True for a word read as an array reference (well formed or not): digits and ``_``, with
    some of each, or ``<digits>_*``. Such a word is never a job name."""
    body = text.removesuffix("_" + WHOLE) + ("_" if text.endswith("_" + WHOLE) else "")
    return ("_" in body and any(c.isdigit() for c in body)
            and all(c == "_" or (c.isascii() and c.isdigit()) for c in body))


def parse(text: str) -> ArrayRef | None:
    """*text* as an array reference, None when it is not shaped as one (an id or a name), or
    ValueError saying what is wrong with it."""
    if not looks_like(text):
        return None
    head, _, tail = text.partition("_")
    if not head:
        raise ValueError(f"{bounds.shown(text)}: the array's id goes before the _; {FORMS}")
    if len(head) > len(str(bounds.MAX_ID)) or not 0 < int(head) <= bounds.MAX_ID:
        raise ValueError(f"{bounds.shown(text)}: array ids are job ids, whole numbers from 1 to {bounds.MAX_ID}")
    if tail == WHOLE:
        return ArrayRef(int(head), None)
    if not tail:
        raise ValueError(f"{bounds.shown(text)}: the element's index goes after the _; {FORMS}")
    if not tail.isdigit():   # a second _
        raise ValueError(f"{bounds.shown(text)}: one _ only; {FORMS}")
    if len(tail) > len(str(bounds.MAX_ARRAY_INDEX)) or int(tail) > bounds.MAX_ARRAY_INDEX:
        raise ValueError(f"{bounds.shown(text)}: array indices go from 0 to {bounds.MAX_ARRAY_INDEX}")
    return ArrayRef(int(head), int(tail))
