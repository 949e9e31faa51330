"""What a benchmark worker computes on, for the JAX and PyTorch backends: the device's name, a wait for its queued
work, and its allocator's peak memory.

On a GPU both frameworks return before the device has finished: a timed step must end with :func:`synchronize`
(JAX's ``block_until_ready`` does the same for the arrays it is given). Memory on a GPU is the framework's own
allocator peak, not the process' resident set size, which does not see device memory.
"""


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
