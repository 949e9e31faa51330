"""What a benchmark worker computes on, for the JAX and PyTorch backends: the device's name, a wait for its queued
work, its allocator's peak memory, and the environment a worker process starts with.

On a GPU both frameworks return before the device has finished: a timed step must end with :func:`synchronize`
(JAX's ``block_until_ready`` does the same for the arrays it is given). Memory on a GPU is the framework's own
allocator peak, not the process' resident set size, which does not see device memory.
"""

import os

REPOSITORY_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker_env(**extra):
    """The environment of a benchmark's worker process: this checkout first on ``PYTHONPATH``, ahead of the caller's
    own entries (kept: on a GPU machine the carried packages are found through them), TensorFlow's log quiet, and
    JAX allocating GPU memory as it goes (workers may run side by side; the default reserves most of the GPU in
    each). ``extra`` sets further variables."""
    path = os.pathsep.join(filter(None, [REPOSITORY_ROOT, os.environ.get("PYTHONPATH")]))
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=path, XLA_PYTHON_CLIENT_PREALLOCATE="false",
                **extra)


def _framework():
    import keras

    return keras.backend.backend()


def device_name():
    """The device the active Keras backend computes on: its first accelerator's name (``NVIDIA H100 80GB HBM3``),
    else ``cpu``."""
    from ot_layers.backends import accelerator_names

    names = accelerator_names()
    return names[0] if names else "cpu"


def devices_in(results):
    """The devices a benchmark's results ran on (each worker's ``device``), for the report."""
    return sorted({result["device"] for result in results.values() if "device" in result})


def on_accelerator():
    return device_name() != "cpu"


def synchronize():
    """Waits for the work queued on the device (PyTorch on a GPU); nothing to do on a CPU."""
    if _framework() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()


def reset_peak_memory():
    if _framework() == "torch" and on_accelerator():
        import torch

        torch.cuda.reset_peak_memory_stats()


def peak_memory_mb():
    """The device allocator's peak in MiB (since :func:`reset_peak_memory` on PyTorch; since the process began on
    JAX), or ``None`` on a CPU (the caller measures the resident set size there)."""
    if not on_accelerator():
        return None
    if _framework() == "jax":
        import jax

        stats = jax.devices()[0].memory_stats() or {}
        return stats["peak_bytes_in_use"] / 2**20 if "peak_bytes_in_use" in stats else None
    import torch

    return torch.cuda.max_memory_allocated() / 2**20
