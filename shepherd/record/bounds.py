"""The record's size bound: what a user controls is capped, and a record over :data:`MAX_BYTES` cut.

:func:`cap` bounds one user-controlled string (an argument, a path, a key),
:data:`LIST_CAP` a list of them. :func:`bounded` is the record as written:
its :func:`digest` taken, then its bulky parts dropped (``_CUTS``, in order)
and named in ``"cut"`` until it fits. Standard library only.
"""

# The small digests (launch spec, environment, the record's own) take CPython's built-in sha256:
# hashlib would map OpenSSL's libcrypto (3.4 MiB resident here) into the fork server and so into
# every shepherd's share of memory. An executable's hash, a cache miss of up to executable.HASH_CAP,
# still takes hashlib (OpenSSL's is several times faster there), imported only when one is read.
try:
    from _sha256 import sha256  # built in (3.11)
except ImportError:
    try:
        from _sha2 import sha256  # type: ignore[no-redef]   # 3.12 on
    except ImportError:
        from hashlib import sha256  # type: ignore[no-redef]

try:
    from shepherd.base.jsoncodec import dumps_canonical
except ImportError:  # run as a file: the base is a top-level package
    from base.jsoncodec import dumps_canonical  # type: ignore[no-redef]

MAX_BYTES = 256 << 10        # a record's size bound
STRING_CAP = 1024            # characters kept of one user-controlled string (an argument, a path, a key)
LIST_CAP = 512               # arguments or environment keys kept
# Parts dropped, in this order, while a record is over MAX_BYTES: the raw snapshots first (their
# deltas stay), then the largest static lists, and last the job's own figures' values (each name
# keeps its unit, count and last value): they are the results the record is about. "*": every key.
_CUTS = (("sentinels", "start", "interrupts"), ("sentinels", "end", "interrupts"),
         ("sentinels", "start"), ("sentinels", "end"), ("cpu", "vulnerabilities"), ("cpu", "caches"),
         ("software", "environment", "values"), ("software", "environment", "keys"),
         ("software", "argv"), ("sentinels", "delta", "interrupts"), ("metrics", "value", "names", "*", "values"))


def cap(text: str, limit: int = STRING_CAP) -> str:
    """A user-controlled string, at most *limit* characters (JSON escapes the rest of its harm)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def _digested(record: dict) -> str:
    """The text a record's digest is of: the record without its digest, keys sorted, compact."""
    return dumps_canonical({k: v for k, v in record.items() if k != "digest"})


def _sha256(text: str) -> str:
    return "sha256:" + sha256(text.encode()).hexdigest()


def digest(record: dict) -> str:
    """``sha256:<hex>`` of the record without its digest, keys sorted, compact."""
    return _sha256(_digested(record))


def _written(record: dict) -> bytes:
    """The record's file, its ``digest`` set: the text :func:`digest` hashes, with the digest
    added as its last key. One serialisation gives both."""
    text = _digested(record)
    record["digest"] = _sha256(text)
    return f'{text[:-1]}{"," if len(text) > 2 else ""}"digest":"{record["digest"]}"}}'.encode()


def bounded(record: dict, limit: int = MAX_BYTES) -> bytes:
    """The record's JSON, with parts dropped (and named in ``cut``) until it fits *limit*."""
    data = _written(record)
    for path in _CUTS:
        if len(data) <= limit:
            break
        parents: list = [record]
        for key in path[:-1]:
            parents = [c for p in parents if isinstance(p, dict)
                       for c in (p.values() if key == "*" else [p.get(key)])]
        parents = [p for p in parents if isinstance(p, dict) and path[-1] in p]
        if not parents:
            continue
        for parent in parents:
            del parent[path[-1]]
        record.setdefault("cut", []).append(".".join(path))
        data = _written(record)
    if len(data) > limit:   # nothing left to drop: keep what identifies the run
        judged = record["verdict"] if isinstance(record.get("verdict"), dict) else {}
        keep = ("schema", "job", "complete", "cut")
        record = {k: record[k] for k in keep if k in record}
        record["verdict"] = {"verdict": judged.get("verdict", "unknown"),
                             "reasons": [cap(str(r)) for r in (judged.get("reasons") or [])[:LIST_CAP // 8]],
                             "causes": [cap(str(c)) for c in (judged.get("causes") or [])[:LIST_CAP // 8]]}
        record.setdefault("cut", []).append("everything else (over the size bound)")
        data = _written(record)
    return data
