import pytest
import torch

# The tests use tiny tensors, for which one thread beats the overhead of several.
torch.set_num_threads(1)


@pytest.fixture
def run_args(tmp_path):
    """Arguments that keep a test run's outputs and caches inside its temporary directory."""
    return [f"output_dir={tmp_path / 'runs'}", f"cache_dir={tmp_path / 'cache'}", "trainer.enable_progress_bar=false"]
