"""PyTorch specifics of the solvers: eager execution (values known except while ``torch.compile`` traces), and
loops that autograd differentiates as they run."""
import torch

DIFFERENTIABLE_WHILE_LOOP = True


def values_known(x):
    del x
    return not torch.compiler.is_compiling()


def fused_small_products():
    return False


def run_solver_loop(fn, *args):
    return fn(*args)
