"""Fixtures for rewriter tests: a temporary source tree to write, transform and read back."""

import pytest

from rewrite_trees import Tree


@pytest.fixture
def tree(tmp_path) -> Tree:
    return Tree(tmp_path)
