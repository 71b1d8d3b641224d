"""`--update-goldens` rewrites golden/expected/ from the current tool; refused when `CI` is set."""

import os

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--update-goldens", action="store_true", default=False,
        help="Rewrite golden/expected/ from the current tool output (refused when CI is set).",
    )


@pytest.fixture(scope="session")
def update_goldens(request) -> bool:
    wanted = request.config.getoption("--update-goldens")
    if wanted and os.environ.get("CI"):
        pytest.fail("--update-goldens is refused when CI is set: goldens change only in a reviewed commit")
    return wanted
