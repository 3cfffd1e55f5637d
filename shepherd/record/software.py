"""The record's ``software`` section: argv, cwd, libc, rlimits and the environment.

Read from the launch spec and the shepherd itself (its limits are the
job's), once the job runs. The environment is recorded by its keys and
digests; its values only when the user asked (``--record-env``). The
section's ``executable`` is ``executable``'s. Standard library only.
"""

import os
import resource

from . import bounds, figures

try:
    from shepherd.base import records, sysread
except ImportError:  # run as a file: the base is a top-level package
    from base import records, sysread  # type: ignore[no-redef]

# What the daemon (launchspec.environment) and the shepherd (the figures' file) set for each job: they
# differ between any two jobs, so the environment's digest without them says whether two jobs were
# submitted with the same one.
PER_JOB_VARS = ("HPC_BATCH_JOB_ID", "HPC_BATCH_ARRAY_INDEX", "HPC_BATCH_ARRAY_JOB_ID", "CUDA_VISIBLE_DEVICES",
                figures.ENV)


def env_block(env: dict) -> bytes:
    """The environment as the sorted ``KEY=VALUE\\0`` block its digest and size are taken of."""
    return b"".join(f"{k}={env[k]}".encode("utf-8", "surrogateescape") + b"\0" for k in sorted(env))


def software(spec: records.LaunchSpec, env_values: bool) -> dict:
    """argv, cwd, libc, rlimits and the environment (values only when the user asked)."""
    env = spec.env or {}
    block = env_block(env)
    keys = sorted(env)
    out = {
        "argv": sysread.field([bounds.cap(a) for a in spec.argv[:bounds.LIST_CAP]], "launch spec"),
        "argc": sysread.field(len(spec.argv), "launch spec"),
        "cwd": sysread.field(bounds.cap(spec.cwd), "launch spec"),
        "libc": _libc(),
        "rlimits": _rlimits(),
        "environment": {
            "keys": sysread.field([bounds.cap(k) for k in keys[:bounds.LIST_CAP]], "launch spec"),
            "count": sysread.field(len(keys), "launch spec"),
            "sha256": sysread.field(bounds.sha256(block).hexdigest(), "launch spec"),
            "bytes": sysread.field(len(block), "launch spec"),
            "submitted_sha256": sysread.field(
                bounds.sha256(env_block({k: v for k, v in env.items() if k not in PER_JOB_VARS})).hexdigest(),
                "launch spec, less " + ", ".join(PER_JOB_VARS)),
        },
    }
    if env_values:
        values = {bounds.cap(k): bounds.cap(env[k]) for k in keys[:bounds.LIST_CAP]}
        out["environment"]["values"] = sysread.field(values, "launch spec (--record-env)")
    return out


def _libc() -> dict:
    try:
        return sysread.field(os.confstr("CS_GNU_LIBC_VERSION"), "confstr(_CS_GNU_LIBC_VERSION)")
    except (OSError, ValueError) as exc:
        return sysread.field(None, "confstr(_CS_GNU_LIBC_VERSION)", sysread.error_text(exc))


def _rlimits() -> dict:
    """The shepherd's limits, which the job inherits unchanged."""
    out = {}
    for name in sorted(n for n in dir(resource) if n.startswith("RLIMIT_")):
        try:
            soft, hard = resource.getrlimit(getattr(resource, name))
        except (OSError, ValueError):
            continue
        out[name[7:].lower()] = [None if soft == resource.RLIM_INFINITY else soft,
                                 None if hard == resource.RLIM_INFINITY else hard]
    return sysread.field(out, "getrlimit(2) (null: unlimited)")
