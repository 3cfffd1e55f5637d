"""What a job asked for, in one typed form from the submit to the launch spec.

``JobRequest`` is a job's request as the daemon keeps it: the resources
(``resources.Request``, what the scheduler and the allocator read) and how
the job runs (``--aslr``, ``--thp``, ``--record``, ``--notify``). The
admission builds it from the wire's ``NewJob``; the scheduler, the views,
the record and the launch spec read its fields; the job's record stores it
as :meth:`JobRequest.to_dict`, the form every earlier version wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shepherd.base.notifytext import check_request as check_notify

from .. import bounds
from .resources import Request

# What the job's reproducibility record leaves out of its copy of the request: where the record
# goes and how the user is told are not part of what was measured.
NOT_RECORDED = ("record_to", "record_is_dir", "notify")


@dataclass(frozen=True)
class JobRequest:
    """A job's request: its resources and its process options (frozen: views share it)."""

    resources: Request = field(default_factory=Request)
    aslr: str = "on"                    # --aslr off: ADDR_NO_RANDOMIZE
    thp: str = "on"                     # --thp off: PR_SET_THP_DISABLE
    record_to: str | None = None        # --record FILE or DIR: absolute
    record_is_dir: bool = False         # record_to is a directory: record.<id>.json in it
    record_env: bool = False            # --record-env
    notify: dict[str, Any] | None = None   # --notify: {"forms": [...], "command": str | None}

    @property
    def benchmark(self) -> str | None:
        """``warn`` or ``strict`` for a ``--benchmark`` job, None for a plain one."""
        return self.resources.benchmark

    def to_dict(self) -> dict[str, Any]:
        """The stored form: the resources' keys and aslr/thp always; the record's keys only when
        a record is asked for elsewhere or with its values, notify only when asked for."""
        r = self.resources
        d: dict[str, Any] = {"cpus": r.cpus, "mem": r.mem, "gpus": r.gpus, "exclusive": r.exclusive,
                             "numa_local": r.numa_local, "numa_local_gpu": r.numa_local_gpu,
                             "gpu_link": r.gpu_link, "benchmark": r.benchmark, "whole_l3": r.whole_l3,
                             "aslr": self.aslr, "thp": self.thp}
        if self.record_to is not None or self.record_env:
            d.update(record_to=self.record_to, record_is_dir=self.record_is_dir, record_env=self.record_env)
        if self.notify is not None:
            d["notify"] = {k: list(v) if isinstance(v, list) else v for k, v in self.notify.items()}
        return d

    def recorded(self) -> dict[str, Any]:
        """The request as the job's reproducibility record keeps it (``requested.request``)."""
        return {k: v for k, v in self.to_dict().items() if k not in NOT_RECORDED}

    @classmethod
    def from_dict(cls, d: Any) -> JobRequest:
        """From its stored form; a key missing (a record of an older version) takes its default.
        ValueError names the first value this daemon could not act on."""
        if not isinstance(d, dict):
            raise ValueError("request must be an object")
        for name, high in (("cpus", bounds.MAX_CPUS), ("mem", bounds.MAX_MEM)):
            if d.get(name) is not None:
                bounds.check_int(d[name], 1, high, f"request.{name}")
        bounds.check_int(d.get("gpus", 0), 0, bounds.MAX_GPUS, "request.gpus")
        for name in ("gpu_link", "record_to"):
            if d.get(name) is not None and not isinstance(d[name], str):
                raise ValueError(f"request.{name} must be text")
        if d.get("benchmark") not in (None, "warn", "strict"):
            raise ValueError("request.benchmark must be warn or strict")
        for name in ("aslr", "thp"):
            if d.get(name, "on") not in ("on", "off"):
                raise ValueError(f"request.{name} must be on or off")
        if d.get("notify") is not None:
            check_notify(d["notify"])
        return cls(
            resources=Request(cpus=d.get("cpus"), mem=d.get("mem"), gpus=d.get("gpus", 0),
                              exclusive=bool(d.get("exclusive")), numa_local=bool(d.get("numa_local")),
                              numa_local_gpu=bool(d.get("numa_local_gpu")), gpu_link=d.get("gpu_link"),
                              benchmark=d.get("benchmark"), whole_l3=bool(d.get("whole_l3"))),
            aslr=d.get("aslr", "on"), thp=d.get("thp", "on"), record_to=d.get("record_to"),
            record_is_dir=bool(d.get("record_is_dir")), record_env=bool(d.get("record_env")),
            notify=d.get("notify"))
