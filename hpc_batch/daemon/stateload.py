"""Loading the state directory at start-up: the journal replayed, the caches checked against it.

Each cache records the batch (journal commit) that makes it durable. At
start-up, a cache of a job the journal lacks is either the last batch, cut
short by a crash before it was acknowledged (dropped, named in the log), or
proof that the journal lost acknowledged batches (a damaged disk, a bad
copy): then every job the caches still hold is recovered from them, named in
the log, and the damaged journal is set aside in quarantine/. A state
directory from before the journal is read from its job.json files once.
"""

import json
import os
import shutil
from dataclasses import dataclass, field

from shepherd.base.records import dumps_wire

from ..bounds import MAX_ID
from ..core.jobs import FINISHED, Job
from . import formats
from .commit import Staging
from .envfiles import UNSTARTED, Shared, SharedRecords, key_of_record
from .jobcache import JobCache
from .journal import JournalError
from .quarantine import Quarantine
from .statefiles import ranges, read_json, unlink


class StateError(Exception):
    """The state directory cannot be used; the message says where and how to recover."""


class StateLocked(StateError):
    """Another daemon holds the state directory."""


def _check_meta(data) -> None:
    """Raise ValueError unless *data* is a usable daemon record."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    next_id = data.get("next_id", 1)
    if isinstance(next_id, bool) or not isinstance(next_id, int) or not 1 <= next_id <= MAX_ID:
        raise ValueError("next_id out of range")
    if not isinstance(data.get("policy_state", {}) or {}, dict):
        raise ValueError("policy_state is not an object")


@dataclass
class _Reading:
    """What one start-up's reading has found so far, step by step."""

    journalled: bool = False       # the journal could be read (False: the caches are all there is)
    records: dict[int, tuple[int, dict]] = field(default_factory=dict)   # the journal's: id -> (seq, record)
    shared: dict[int, dict] = field(default_factory=dict)
    dropped: set[int] = field(default_factory=set)
    caches: dict[int, dict | None] = field(default_factory=dict)
    high: int = 0                  # the newest batch a cache was written for
    lost: bool = False             # batches after the journal's last were acknowledged
    cut: set[int] = field(default_factory=set)
    cut_jobs: list[int] = field(default_factory=list)
    chosen: dict[int, dict] = field(default_factory=dict)
    stale: set[int] = field(default_factory=set)
    recovered: list[int] = field(default_factory=list)
    unacked: list[int] = field(default_factory=list)


class StateLoader:
    """Reads a state directory's journal and caches into the store's rooms, once, at start-up."""

    def __init__(self, root: str, staging: Staging, cache: JobCache, envs: SharedRecords,
                 quarantine: Quarantine, notes: list):
        self.root = root
        self.staging = staging
        self.journal = staging.journal
        self.cache = cache
        self.envs = envs
        self.quarantine = quarantine
        self.notes = notes       # what loading set aside or rebuilt, for the log

    def read(self) -> tuple[dict, list]:
        """Jobs and meta from the journal and the caches, each job.json brought up to date."""
        r = _Reading()
        meta = self._replay_journal(r)
        self._read_caches(r)
        self._find_lost_batches(r)
        # A bulk stored a slice per turn that a crash cut short was never acknowledged: none of it stays.
        r.cut = {key for key, data in r.shared.items() if data.get("pending") is True}
        for job_id in sorted(set(r.caches) | set(r.records)):
            self._choose(job_id, r)
        self._note_unacknowledged(r)
        self._drop_cut_bulks(r)
        self._recover_lost_batches(r)
        jobs = self._build(r.chosen, r.shared, r.stale)
        if r.stale:
            self.notes.append(f"rebuilt {len(r.stale)} job.json files from the journal")
        self.envs.sweep()
        return meta, jobs

    def _replay_journal(self, r: _Reading) -> dict:
        """The meta, and the journal's records into *r*; daemon.json's meta when there is no journal."""
        try:
            contents = self.journal.read()
        except formats.NewerFormat as exc:   # a newer daemon's truth: neither read nor replaced
            raise StateError(str(exc)) from None
        except JournalError as exc:
            self.quarantine.move(self.journal.path, "the journal", exc,
                                 "job records are read from their job.json files instead")
            contents = None
        if contents is None:
            return self._legacy_meta()
        r.journalled = True
        meta = self._replay(contents.entries, r.records, r.shared, r.dropped)
        self.staging.batch = contents.batch or 0
        return self._checked_meta(meta, "the journal's daemon record")

    def _read_caches(self, r: _Reading) -> None:
        """Every job.json under jobs/ into *r*; one in a newer format is set aside with its job."""
        try:
            names = os.listdir(self.cache.dir)
        except OSError as exc:
            raise StateError(f"cannot read {self.cache.dir}: {exc.strerror}") from None
        for job_id in (int(n) for n in names if n.isdigit() and len(n) <= 20):
            try:
                r.caches[job_id] = self.cache.read(job_id)
            except formats.NewerFormat as exc:
                self.quarantine.move(self.cache.job_dir(job_id), f"job {job_id}", exc,
                                     "that job is no longer tracked")
                r.records.pop(job_id, None)

    def _find_lost_batches(self, r: _Reading) -> None:
        """Whether caches were written for batches after the journal's last (so it lost some)."""
        r.high = max((c["batch"] for c in r.caches.values() if c is not None and isinstance(c.get("batch"), int)),
                     default=0)
        r.lost = r.journalled and r.high > self.staging.batch + 1

    def _choose(self, job_id: int, r: _Reading) -> None:
        """Pick the record a job is loaded from (or drop or set aside the job)."""
        cached = r.caches.get(job_id)
        if self._in_cut_bulk(job_id, cached, r):
            return
        if job_id in r.records:
            self._choose_journalled(job_id, cached, r)
            return
        if job_id in r.dropped:          # evicted; its removal was cut short
            shutil.rmtree(self.cache.job_dir(job_id), ignore_errors=True)
            return
        if cached is None:
            self._drop_unreadable_cache(job_id)
            return
        self._choose_unjournalled(job_id, cached, r)

    def _in_cut_bulk(self, job_id: int, cached: dict | None, r: _Reading) -> bool:
        """True (its directory removed) for a job of a bulk whose storing was cut short."""
        if not r.cut:
            return False
        data = r.records[job_id][1] if job_id in r.records else cached
        if data is not None and key_of_record(data) in r.cut:
            r.cut_jobs.append(job_id)
            shutil.rmtree(self.cache.job_dir(job_id), ignore_errors=True)
            return True
        return False

    def _choose_journalled(self, job_id: int, cached: dict | None, r: _Reading) -> None:
        """The journal's record, or the cache when it was written after it."""
        seq, data = r.records[job_id]
        if cached is not None and isinstance(cached.get("seq"), int) and cached["seq"] >= seq:
            r.chosen[job_id] = cached   # written after its last durable record (not fsynced, but there)
            if r.lost and isinstance(cached.get("batch"), int) and cached["batch"] > self.staging.batch:
                r.recovered.append(job_id)
        else:
            r.chosen[job_id] = data
            r.stale.add(job_id)

    def _drop_unreadable_cache(self, job_id: int) -> None:
        """A job the journal lacks and whose cache cannot be read: set aside, or never acknowledged."""
        if os.path.exists(os.path.join(self.cache.job_dir(job_id), "job.json")):
            self.quarantine.move(self.cache.job_dir(job_id), f"job {job_id}", "its job.json cannot be read",
                                 "that job is no longer tracked")
        else:    # a submit cut short before its first write: it was never acknowledged
            shutil.rmtree(self.cache.job_dir(job_id), ignore_errors=True)

    def _choose_unjournalled(self, job_id: int, cached: dict, r: _Reading) -> None:
        """A cache the journal lacks: the caches' truth, an unacknowledged last batch, or a lost one."""
        batch = cached.get("batch")
        if not r.journalled:           # no journal (from before it, or set aside): the caches are all there is
            r.chosen[job_id] = cached
        elif not isinstance(batch, int) or (batch == self.staging.batch + 1 and not r.lost):
            r.unacked.append(job_id)     # the last batch, which a crash cut short before it was acknowledged
            shutil.rmtree(self.cache.job_dir(job_id), ignore_errors=True)
        else:                          # its batch was acknowledged, and the journal lost it
            r.chosen[job_id] = cached
            r.recovered.append(job_id)

    def _note_unacknowledged(self, r: _Reading) -> None:
        """Name the jobs of the last batch, cut short before it was acknowledged."""
        if r.unacked:
            self.notes.append(f"dropped jobs {ranges(r.unacked)}: their submit was never acknowledged "
                              f"(a crash cut the journal's last batch short)")

    def _drop_cut_bulks(self, r: _Reading) -> None:
        """Remove the shared records (and environments) of bulks whose storing was cut short."""
        for key in sorted(r.cut):
            del r.shared[key]
            unlink(os.path.join(self.envs.shared_dir, f"{key}.json"))
            unlink(os.path.join(self.envs.env_dir, str(key)))
        if r.cut:
            self.notes.append(f"dropped jobs {ranges(r.cut_jobs) or 'none'} of bulk submits from "
                              f"{ranges(sorted(r.cut))}: a stop or crash cut their storing short, before "
                              f"they were acknowledged")

    def _recover_lost_batches(self, r: _Reading) -> None:
        """Name the jobs recovered from their caches, and keep the journal that lost them."""
        if r.recovered:
            self.notes.append(f"the journal lost acknowledged records (its last whole batch is "
                              f"{self.staging.batch}, job.json files were written up to batch {r.high}); "
                              f"recovered jobs {ranges(r.recovered)} from their job.json files")
            self.quarantine.keep_journal(self.journal.path)

    def _replay(self, entries: list, records: dict, shared: dict, dropped: set) -> dict:
        """Fill *records* (id -> (seq, record)), *shared* and *dropped* from the journal's entries,
        in order; returns the last meta record."""
        meta: dict = {}
        for e in entries:
            self.staging.seq = max(self.staging.seq, e["seq"])
            if isinstance(e.get("job"), dict) and isinstance(e["job"].get("id"), int):
                data = e["job"]
                if e.get("same") == "argv" and "argv" not in data:   # a change: its command is the last line's
                    before = records.get(data["id"])
                    if before is not None and "argv" in before[1]:
                        data["argv"] = before[1]["argv"]
                records[data["id"]] = (e["seq"], data)
                dropped.discard(data["id"])
            elif isinstance(e.get("shared"), dict) and isinstance(e["shared"].get("id"), int):
                shared[e["shared"]["id"]] = e["shared"]
            elif isinstance(e.get("drop"), int):
                records.pop(e["drop"], None)
                dropped.add(e["drop"])
            elif isinstance(e.get("meta"), dict):
                meta = e["meta"]
        return meta

    def _build(self, chosen: dict, shared: dict, stale: set) -> list:
        """Jobs from their chosen records: argv from their shared record, old environments moved out.

        The caches in *stale* (missing, or older than the journal) are rewritten.
        """
        jobs = []
        for job_id, data in sorted(chosen.items()):
            key = key_of_record(data)
            sh = self._shared_for(key, shared)
            env = data.pop("env", None)
            if isinstance(env, dict):
                sh = self._migrate_env(key, data, env, sh)
            filled = "argv" not in data and sh is not None and sh.argv is not None
            if filled and sh is not None:
                data["argv"] = sh.argv     # one list, shared by every element of the bulk
            try:
                job = Job.from_dict(data)
                if job.id != job_id:
                    raise ValueError(f"record says job {job.id}")
            except (ValueError, TypeError, KeyError, RecursionError) as exc:
                self.quarantine.move(self.cache.job_dir(job_id), f"job {job_id}", exc,
                                     "that job is no longer tracked")
                continue
            if job_id in stale or env is not None:
                try:
                    self.cache.write(job, {k: v for k, v in data.items() if not (filled and k == "argv")})
                except OSError as exc:
                    raise StateError(f"cannot rewrite {self.cache.job_dir(job_id)}: {exc.strerror}") from None
            if sh is not None:
                self.envs.refer(job, sh)
            if job.state != FINISHED:
                self.staging.owe(job, len(dumps_wire({k: v for k, v in data.items() if k != "argv"})))
            self.staging.live.add(job_id)
            jobs.append(job)
        return jobs

    def _shared_for(self, key: int | None, shared: dict) -> Shared | None:
        """The shared record of a submit: the journal's, else its cache (a journal that lost it)."""
        if key is None:
            return None
        if key in self.envs.records:
            return self.envs.records[key]
        data = shared.get(key)
        if data is None:
            data = read_json(os.path.join(self.envs.shared_dir, f"{key}.json"))
        if data is None:
            return None
        try:
            sh = Shared.from_record(data)
        except ValueError as exc:
            self.notes.append(f"the shared record of jobs from {key} cannot be used ({exc})")
            return None
        self.envs.records[key] = sh
        return sh

    def _migrate_env(self, key: int | None, data: dict, env: dict, sh: Shared | None) -> Shared | None:
        """A record from before env files: its environment moves to one (only while it has not started)."""
        if data.get("state") not in UNSTARTED or key is None or sh is not None:
            return sh
        forward, job_env = env.get("forward"), env.get("job_env") or {}
        sh = Shared(key, None, dict(env.get("base") or {}), forward is not None or bool(job_env))
        self.envs.records[key] = sh
        try:
            if sh.secret:
                self.envs.write_env(key, {"forward": forward, "job_env": job_env})
                self.envs.unsynced.add(key)    # fsynced before the snapshot that drops the old lines
            self.envs.write_shared(sh, self.staging.batch + 1)
        except OSError as exc:
            raise StateError(f"cannot write {self.envs.env_dir}: {exc.strerror}") from None
        return sh

    def _checked_meta(self, data, what: str) -> dict:
        """*data* when it is a usable daemon record; else a note, and an empty one."""
        try:
            _check_meta(data)
        except ValueError as exc:
            self.notes.append(f"{what} could not be used ({exc}); job ids continue after the highest one "
                              f"on disk; scheduling state starts afresh")
            return {}
        return data

    def _legacy_meta(self) -> dict:
        """Read daemon.json (empty dict when the directory is new or it had to be set aside)."""
        path = os.path.join(self.root, "daemon.json")
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
            _check_meta(data)
            return data
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:
            self.quarantine.move(path, "daemon.json", exc,
                                 "job ids continue after the highest one on disk; scheduling state starts afresh")
            return {}
