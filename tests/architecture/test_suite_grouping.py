"""The suite's grouping holds (tests/conftest.py): under `--dist loadgroup` every
module's tests run on one worker, so its module-scoped launches are made once.
pytest 9.2 with pytest-xdist 3.8 grouped nothing, silently: the suite's time grew
by a launch per module fixture and per shared run on the second worker (the pin
in pyproject.toml)."""

import re
import subprocess
import sys

from tests.support.jobs import REPO

MODULES = ("tests/live/test_monitor_alerts.py", "tests/analysis/test_stream_waits.py")


def test_each_modules_tests_run_on_one_worker_with_their_group_in_the_id():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider", *MODULES],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    ran = re.findall(r"^\[(gw\d)\] .*PASSED (\S+)", proc.stdout, re.M)
    assert len(ran) >= 12, proc.stdout[-3000:]
    workers = {}
    for worker, test_id in ran:
        path, group = test_id.partition("::")[0], test_id.rpartition("@")[2]
        assert group == path.removesuffix(".py").replace("/", "."), test_id  # the module's group
        workers.setdefault(path, set()).add(worker)
    assert set(workers) == set(MODULES) and all(len(w) == 1 for w in workers.values()), workers
