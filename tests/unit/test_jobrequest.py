"""JobRequest: a job's request in one typed form, stored as every earlier version stored it."""

import pytest

from hpc_batch.core.jobrequest import JobRequest
from hpc_batch.core.resources import Request

PLAIN = {"cpus": None, "mem": None, "gpus": 0, "exclusive": False, "numa_local": False, "numa_local_gpu": False,
         "gpu_link": None, "benchmark": None, "whole_l3": False, "aslr": "on", "thp": "on"}
NOTIFY = {"forms": ["tty"], "command": None}

# (what, the typed request, its stored form)
STORED_CASES = [
    ("a plain job", JobRequest(), PLAIN),
    ("resources", JobRequest(Request(cpus=4, mem=1 << 30, gpus=2, exclusive=True, gpu_link="NV1")),
     PLAIN | {"cpus": 4, "mem": 1 << 30, "gpus": 2, "exclusive": True, "gpu_link": "NV1"}),
    ("a strict benchmark with its L3", JobRequest(Request(benchmark="strict", numa_local=True, whole_l3=True),
                                                  aslr="off", thp="off"),
     PLAIN | {"benchmark": "strict", "numa_local": True, "whole_l3": True, "aslr": "off", "thp": "off"}),
    ("a record to a directory", JobRequest(record_to="/home/a/r", record_is_dir=True),
     PLAIN | {"record_to": "/home/a/r", "record_is_dir": True, "record_env": False}),
    ("the environment's values only", JobRequest(record_env=True),
     PLAIN | {"record_to": None, "record_is_dir": False, "record_env": True}),
    ("notify", JobRequest(notify=NOTIFY), PLAIN | {"notify": NOTIFY}),
]


@pytest.mark.parametrize("asked, stored", [c[1:] for c in STORED_CASES], ids=[c[0] for c in STORED_CASES])
def test_a_request_is_stored_as_before_and_comes_back_the_same(asked, stored):
    assert asked.to_dict() == stored
    assert JobRequest.from_dict(stored) == asked


def test_the_stored_form_shares_nothing_with_the_request():
    asked = JobRequest(notify={"forms": ["tty"], "command": None})
    asked.to_dict()["notify"]["forms"].append("cmd")
    assert asked.notify == {"forms": ["tty"], "command": None}


def test_an_older_record_without_the_newer_keys_takes_their_defaults():
    assert JobRequest.from_dict({"cpus": 2, "mem": 1 << 30, "gpus": 0}) == JobRequest(Request(cpus=2, mem=1 << 30))


def test_the_record_keeps_what_was_measured_not_where_it_goes():
    asked = JobRequest(Request(cpus=2), record_to="/r.json", record_env=True, notify=NOTIFY)
    assert asked.recorded() == PLAIN | {"cpus": 2, "record_env": True}


# (what, the stored request, what the error says)
REFUSED_CASES = [
    ("not an object", ["cpus", 2], "request must be an object"),
    ("no CPUs", PLAIN | {"cpus": 0}, "request.cpus"),
    ("memory as text", PLAIN | {"mem": "1G"}, "request.mem"),
    ("GPUs below none", PLAIN | {"gpus": -1}, "request.gpus"),
    ("a link as a number", PLAIN | {"gpu_link": 5}, "request.gpu_link must be text"),
    ("a record path as a list", PLAIN | {"record_to": ["/r"]}, "request.record_to must be text"),
    ("an unknown benchmark mode", PLAIN | {"benchmark": "lenient"}, "request.benchmark must be warn or strict"),
    ("aslr neither on nor off", PLAIN | {"aslr": "maybe"}, "request.aslr must be on or off"),
    ("thp as a boolean", PLAIN | {"thp": False}, "request.thp must be on or off"),
    ("a notify with no form", PLAIN | {"notify": {"forms": []}}, "notify"),
]


@pytest.mark.parametrize("stored, said", [c[1:] for c in REFUSED_CASES], ids=[c[0] for c in REFUSED_CASES])
def test_a_stored_request_this_daemon_cannot_act_on_is_refused_naming_it(stored, said):
    with pytest.raises(ValueError, match=said):
        JobRequest.from_dict(stored)
