"""What dispatch new says about a job's memory (hpc_batch/client/submitted.py)."""

from hpc_batch.client.submitted import memory_words
from hpc_batch.core.sizes import GiB


def test_an_enforced_budget_is_called_a_budget_and_says_where_it_came_from():
    assert memory_words({"mem": 2 * GiB, "mem_assigned": False, "mem_enforced": True}) == \
        "memory budget 2G (requested)"
    assert memory_words({"mem": GiB // 2, "mem_assigned": True, "mem_enforced": True}, each=True) == \
        "memory budget 512M each (assigned by default)"


def test_without_cgroups_the_figure_is_not_called_a_budget():
    words = memory_words({"mem": 2 * GiB, "mem_assigned": True, "mem_enforced": False})
    assert words == "memory 2G (assigned by default), not enforced: the daemon runs with --no-cgroups"
    assert "budget" not in words


def test_a_reply_from_an_older_daemon_without_the_field_reads_as_enforced():
    assert memory_words({"mem": 2 * GiB, "mem_assigned": False}) == "memory budget 2G (requested)"
