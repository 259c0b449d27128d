from collections.abc import Iterator

import pytest

from kvhandoff.model_checker.z3_thread_guard import z3_on_this_thread


@pytest.fixture(autouse=True)
def z3_finalisers_stay_on_the_test_thread() -> Iterator[None]:
    # Tests here call Z3 directly, while servers of other test modules may still be winding down
    # on other threads: see model_checker/z3_thread_guard.py.
    with z3_on_this_thread():
        yield
