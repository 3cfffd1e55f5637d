"""A job an older daemon stored under a name now refused for new jobs still loads."""

from hpc_batch.core import jobs
from hpc_batch.core.jobnames import stored_name, valid_name


def test_a_negative_number_is_refused_for_new_jobs_but_loads_when_stored():
    assert not valid_name("-5")
    assert stored_name("-5")
    assert valid_name("prep-5") and stored_name("prep-5")
    assert not stored_name("5") and not stored_name("3-7") and not stored_name("a b")
    job = jobs.Job(id=7, uid=0, gid=0, user="root", argv=["true"], cwd="/", submitted=1.8e9,
                   max_time=60, budget={"mem": 1 << 20}, name="-5")
    assert jobs.Job.from_dict(job.to_dict()).name == "-5"
