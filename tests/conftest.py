"""Shared fixtures. Tests never need credentials and must fail rather than reach real AWS."""
from __future__ import annotations

import os

# Fake credentials and a dead endpoint: anything that escapes moto fails at once instead of
# calling AWS with whatever credentials the machine happens to have.
os.environ.update({
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    "CDK_DISABLE_VERSION_CHECK": "1",
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
})
for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
    os.environ.pop(var, None)

# The node contract's directories (/etc, /run, /scratch), moved somewhere harmless for the whole
# session; tests/runtime gives each test its own.
import tempfile  # noqa: E402

_NODE = tempfile.mkdtemp(prefix="dl-node-")
for _var in ("DL_ETC_DIR", "DL_RUN_DIR", "DL_SCRATCH", "DL_LOG_DIR"):
    os.environ[_var] = os.path.join(_NODE, _var.lower())
# The live-price cache, likewise: never the user's ~/.cache (tests that read it set their own).
os.environ["DL_LAUNCHER_CACHE"] = os.path.join(_NODE, "price-cache")

import pytest  # noqa: E402


@pytest.fixture
def aws():
    """moto in-process for every AWS API; the dead endpoint is lifted only inside it."""
    from moto import mock_aws

    saved = os.environ.pop("AWS_ENDPOINT_URL")
    try:
        with mock_aws():
            yield
    finally:
        os.environ["AWS_ENDPOINT_URL"] = saved


# The files that take minutes, longest first: scripts/test.sh runs the suite as `-n 2 --dist
# loadfile` (a file's module fixtures are built once, on one worker), and starting these first
# keeps one worker from finishing a long file alone at the end. Approximate totals in a full CI run
# (seconds, 2 cores): test_portfolio ~390, test_framework_drill ~330, test_drill ~300,
# test_sharded_drill ~210, test_app ~180, test_supervisor ~115, test_local_deploy ~105,
# test_job_on_node ~100, test_consumer ~90, test_local_bench ~90, test_throttled_drill ~70,
# test_types ~70, test_local_product_deploy ~40. One exception to longest-first: test_app goes
# before test_drill, so that (each worker being handed its next file as it starts one) the three
# torchrun drills run one after another on one worker, not two at once on the 2 cores, while the
# other worker has the portfolio, the app and then the short files.
_LONG_FILES = ("test_portfolio.py", "test_framework_drill.py", "test_app.py", "test_drill.py", "test_sharded_drill.py",
               "test_supervisor.py", "test_local_deploy.py", "test_job_on_node.py", "test_consumer.py",
               "test_local_bench.py", "test_throttled_drill.py", "test_types.py", "test_launch_template.py",
               "test_local_product_deploy.py", "test_api_limits.py", "test_bench_stack.py", "test_reference.py",
               "test_launch.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(_LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(_LONG_FILES)))
