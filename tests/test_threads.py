"""conftest.threads: each test's torch thread count, whatever the tests before it set."""
import os

import pytest
import torch


def test_a_test_on_tiny_models_starts_at_one_thread():
    assert torch.get_num_threads() == 1
    torch.set_num_threads(3)  # (as a CLI test's --threads does: the next test starts at its own count again)


def test_the_next_one_starts_at_one_thread_again():
    assert torch.get_num_threads() == 1


@pytest.mark.smollm2
def test_a_test_on_a_real_model_starts_at_two():
    assert torch.get_num_threads() == min(2, os.cpu_count() or 1)
