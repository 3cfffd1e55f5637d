"""PSI/J's entry for the hpc-batch executor.

The wheel ships this file as ``psij-descriptors/hpc_batch.py`` (pyproject's
force-include): PSI/J imports every module of that namespace package found
on sys.path, registers the executors each lists in ``__PSI_J_EXECUTORS__``,
and loads the class by path from ``hpc_batch/psij/executor.py`` beside it.
Needs psij-python, which the ``[psij]`` extra installs.
"""

from packaging.version import Version
from psij.descriptor import Descriptor

from hpc_batch import __version__
from hpc_batch.psij.mapping import EXECUTOR

__PSI_J_EXECUTORS__ = [
    Descriptor(name=EXECUTOR, nice_name=EXECUTOR, version=Version(__version__),
               cls="hpc_batch.psij.executor.HpcBatchJobExecutor"),
]
