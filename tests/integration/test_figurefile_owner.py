"""The figures file is the job's user's (shepherd/record/figurefile.py): giving it away needs root,
so this lives with the integration tests, which run as root; the rest of its tests are unit tests
(tests/unit/test_figures.py)."""

import os

from ci_host import needs

from shepherd.record import figurefile


@needs(os.geteuid() == 0, "giving the file away needs root")
def test_create_gives_the_file_to_the_jobs_user(tmp_path):
    path, why = figurefile.create(3, 4242, 4343, str(tmp_path))
    assert why is None and (os.stat(path).st_uid, os.stat(path).st_gid) == (4242, 4343)
