"""Export for TF Serving (SavedModel) and ONNX, verified against Keras where otzoo cannot be imported.

- :func:`to_saved_model` (:mod:`export.saved_model`): ``<base_dir>/<version>/`` with named signatures, warm-up
  requests (:mod:`export.warmup`) and ``models.config``;
- :func:`to_onnx` (:mod:`export.onnx`): the same names, a dynamic batch axis;
- :func:`verify` (:mod:`export.verification`): max abs differences per artifact and output, each artifact run in a
  child process that cannot import otzoo (:mod:`export.isolation`);
- the served interface by task (:mod:`export.signatures`) and ``otzoo export`` (:mod:`otzoo.export_command`).
"""
from export.onnx import OnnxConversionError, to_onnx
from export.saved_model import to_saved_model
from export.signatures import TASKS, infer_task, serving_spec
from export.verification import ParityReport, VerificationError, verify

__all__ = ["to_saved_model", "to_onnx", "OnnxConversionError", "verify", "ParityReport", "VerificationError", "TASKS",
           "infer_task", "serving_spec"]
