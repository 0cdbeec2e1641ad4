"""Integration fixtures: a real control plane (kube_fixtures), real Ray
(ray_fixtures), the operator process (operator_fixtures), PostgreSQL
(postgres_fixtures)."""
import os
import shutil
import tempfile

import pytest

from autoscaler_fixtures import *  # noqa: F401,F403
from kube_fixtures import *  # noqa: F401,F403  (pytest discovers fixtures by name)
from kueue_fixtures import *  # noqa: F401,F403
from operator_fixtures import *  # noqa: F401,F403
from pod_fixtures import *  # noqa: F401,F403
from postgres_fixtures import *  # noqa: F401,F403
from ray_fixtures import *  # noqa: F401,F403
from recovery_fixtures import *  # noqa: F401,F403


def pytest_configure(config):
    config.addinivalue_line("markers", "soak: a test with a quick size (make test) and a full one "
                                       "(make soak, KUBETUNE_TEST_SIZE=full): tests/integration/soak.py")


@pytest.fixture(autouse=True, scope="session")
def _results_store_of_the_session():
    """Processes the tests start without a --results-url (kubetune run, the chart's
    operator) write to a store of this session, never to the user's own."""
    directory = tempfile.mkdtemp(prefix="kubetune-results-")
    before = os.environ.get("KUBETUNE_RESULTS_URL")
    os.environ["KUBETUNE_RESULTS_URL"] = f"sqlite:///{directory}/results.db"
    yield
    # put back what the user had, so nothing leaks into later tests (tests/unit)
    if before is None:
        os.environ.pop("KUBETUNE_RESULTS_URL", None)
    else:
        os.environ["KUBETUNE_RESULTS_URL"] = before
    shutil.rmtree(directory, ignore_errors=True)
