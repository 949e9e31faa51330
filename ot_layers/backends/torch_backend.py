"""PyTorch specifics of the solvers: eager execution (values known except while ``torch.compile`` traces), and
loops that autograd differentiates as they run."""
import contextlib

import torch

DIFFERENTIABLE_WHILE_LOOP = True


def values_known(x):
    del x
    return not torch.compiler.is_compiling()


def fused_small_products(matrix):
    del matrix
    return False


def fused_matvec(matrix):
    """True for a tensor on the CPU: PyTorch's batched matmul (behind ``einsum``) runs many small matrix-vector
    products two to five times slower there than a multiply-and-sum (measured for the Sinkhorn iterations of the MPW
    and DeepEMD heads); on an accelerator the dots stay."""
    return matrix.device.type == "cpu"


def run_solver_loop(fn, *args):
    return fn(*args)


def host_call(fn, arrays, outputs):
    """``fn(*arrays)`` run by NumPy on detached CPU copies of ``arrays``; the results come back as tensors on the
    first array's device. ``outputs`` gives each result's ``(shape, dtype)``. ``fn`` takes and returns NumPy arrays
    (a tuple, one per output); no gradient flows through the call."""
    import numpy as np

    values = [x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in arrays]
    device = next((x.device for x in arrays if isinstance(x, torch.Tensor)), None)
    return [torch.as_tensor(np.ascontiguousarray(r, dtype=d), device=device)
            for r, (_, d) in zip(fn(*values), outputs)]


def replicas_in_sync():
    """1: otzoo trains on one device on this backend, so a batch loss needs no per-replica scaling."""
    return 1


def eager_scope():
    """Nothing: outside a stateless scope, variables always hold concrete values."""
    return contextlib.nullcontext()


def accelerator_names():
    """The models of the CUDA GPUs PyTorch sees, empty on a CPU-only machine."""
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
