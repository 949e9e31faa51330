"""otzoo's command line (``otzoo``, ``python -m otzoo``): the one place that brings the data, the recipes, export
and explain together. ``otzoo.cli.main(argv=None)`` runs it and returns the exit status."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported

__version__ = "0.2.0"
