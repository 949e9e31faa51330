"""Export to SavedModel (TF Serving) and ONNX, and parity checks against Keras."""
from export.exporters import to_onnx, to_saved_model, verify

__all__ = ["to_saved_model", "to_onnx", "verify"]
