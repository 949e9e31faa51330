"""What the benchmarks share around their measurements, with no framework imported: the ``argparse`` type of their
counts (rounds, repeats, calls) and the writing of their JSON report. The benchmarks that run on a GPU machine
without TensorFlow import it in their parent process, which times each framework in a subprocess of its own."""
import argparse
import json
import os


def positive_count(text):
    """An ``argparse`` type: a whole number >= 1 (a benchmark of zero rounds has no median to report)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def write_json(path, record, indent=2):
    """Write ``record`` to ``path`` as JSON, creating its folder (``path`` may be a bare file name)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(record, handle, indent=indent)
