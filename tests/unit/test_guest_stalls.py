"""The system tier's judgement of a guest kernel's RCU stall report: the host's (a vCPU thread the
host did not run) or the guest's. The fixture is a real report, copied verbatim from the SMT
guest's dmesg in a CI system tier run on a 2-core host at load 9 (tests/fixtures/README.md)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "system"))

from guestlib import rcu_stall_is_the_hosts  # noqa: E402

with open(os.path.join(os.path.dirname(HERE), "fixtures", "dmesg", "rcu-stall-tcg.txt")) as f:
    HEAD, BLOCK = f.read().split("\n", 1)


def test_a_cpu_that_took_a_quarter_of_the_ticks_with_interrupts_on_was_not_run():
    why = rcu_stall_is_the_hosts(HEAD, BLOCK)
    assert "CPU 0 took 1359 timer ticks of a 5254-jiffy grace period" in why


def test_a_cpu_that_took_most_ticks_really_held_up_rcu():
    assert rcu_stall_is_the_hosts(HEAD, BLOCK.replace("(1359 ticks this GP)", "(5200 ticks this GP)")) == ""


def test_a_cpu_with_interrupts_off_may_take_no_ticks_and_still_be_stuck():
    assert rcu_stall_is_the_hosts(HEAD, BLOCK.replace("EFLAGS: 00000246", "EFLAGS: 00000046", 1)) == ""


def test_a_report_without_a_backtrace_or_a_self_detected_stall_is_the_guests():
    no_trace = "\n".join(line for line in BLOCK.splitlines() if "EFLAGS" not in line)
    assert rcu_stall_is_the_hosts(HEAD, no_trace) == ""
    assert rcu_stall_is_the_hosts("[ 1.0] rcu: INFO: rcu_preempt self-detected stall on CPU", BLOCK) == ""
