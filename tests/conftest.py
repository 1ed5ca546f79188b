"""Test setup: 8 fake CPU devices, set before JAX is imported, and shared fixtures."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

import helpers  # noqa: E402


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> str:
    """A random tiny Llama (untied head, GQA) saved as a training state at steps 3 and 5."""
    path = str(tmp_path_factory.mktemp("ckpt") / "tiny")
    helpers.save_random_checkpoint(path, steps=(3, 5))
    return path


@pytest.fixture(scope="session")
def demo_checkpoint() -> str:
    from ppl_jax.config import demo_checkpoint_dir

    path = demo_checkpoint_dir()
    if not os.path.isdir(path):
        pytest.fail(f"the demo checkpoint is missing at {path}; run launch/train_demo.py")
    return path
