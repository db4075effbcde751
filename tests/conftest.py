import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A randomly initialised tiny Qwen2 + character tokenizer, saved in Hugging Face format."""
    from rlplat.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray instance shared by the tests that need one (started lazily)."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
