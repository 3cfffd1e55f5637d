"""cut.join must write exactly what shlex.join does (cut.py avoids shlex, which imports re)."""

import shlex

from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_batch.core import cut

TEXT = st.text(alphabet=st.one_of(st.sampled_from("aZ09_@%+=:,./-'\" \t\n$*!\\~é"),
                                  st.characters(codec="utf-8"), st.just("\udcff")), max_size=12)


@given(st.lists(TEXT, max_size=5))
@settings(max_examples=500, deadline=None)
def test_join_is_shlex_join(argv):
    assert cut.join(argv) == shlex.join(argv)


def test_join_known_forms():
    assert cut.join(["echo", "hi there", "", "it's", "a=b", "é"]) == shlex.join(["echo", "hi there", "", "it's",
                                                                                 "a=b", "é"])
    assert cut.cut_command(["sh", "-c", "echo $HOME"]) == ("sh -c 'echo $HOME'", 18)
