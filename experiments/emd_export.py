"""Export parity of an entropic EMD model with a convolutional backbone, and the exact method's refusal.

Model: small_convnet (28x28 -> 7x7x64) followed by StructuredFC(5 classes, 49 nodes, EMDHead(method=...)); the nodes
are set from the mean feature maps of 5 Fashion-MNIST images per class. Exports to SavedModel and ONNX, runs each
artifact in a fresh process (export.verify) and writes experiments/results/emd_export.json. The head computes in
float32, so parity is reported relative to the logits' scale (max |diff| / max |logit|, stated bound
``ot_layers.layers.emd_head.EXPORT_PARITY_RTOL``).
Run: ``PYTHONPATH=. python experiments/emd_export.py``.
"""
import argparse
import json
import os
import tempfile

import keras
import numpy as np

import export
from ot_layers import StructuredFC
from ot_layers.layers.emd_head import EXPORT_PARITY_RTOL
from training.data.fashion_mnist import load_fashion_mnist
from zoo import small_convnet


def build(method):
    keras.utils.set_random_seed(0)
    backbone = small_convnet((28, 28, 1), width=16, feature_dim=64)
    images = keras.Input((28, 28, 1))
    head = StructuredFC(5, 49, head={"method": method})
    return keras.Model(images, head(backbone(images))), backbone, head


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "emd_export.json"),
                        help="the JSON file written (default: %(default)s)")
    args = parser.parse_args()
    x, y = load_fashion_mnist("test", limit=2000)
    support = np.concatenate([np.flatnonzero(y == k)[:5] for k in range(5)])
    queries = x[np.flatnonzero(y < 5)[100:116]]
    report = {}
    model, backbone, head = build("sinkhorn")
    head.initialize_from_support(backbone.predict(x[support], verbose=0), y[support])
    with tempfile.TemporaryDirectory() as tmp:
        saved = export.to_saved_model(model, os.path.join(tmp, "saved_model"))
        onnx_path = export.to_onnx(model, os.path.join(tmp, "model.onnx"))
        report["sinkhorn_max_abs_diff"] = export.verify(model, queries, saved_model_dir=saved, onnx_path=onnx_path)
    logits = np.asarray(model(queries))
    report["sinkhorn_logit_range"] = [float(logits.min()), float(logits.max())]
    scale = float(np.max(np.abs(logits)))
    report["sinkhorn_relative_diff"] = {kind: diff / scale for kind, diff in report["sinkhorn_max_abs_diff"].items()}
    report["relative_bound"] = EXPORT_PARITY_RTOL
    report["holds"] = all(value <= EXPORT_PARITY_RTOL for value in report["sinkhorn_relative_diff"].values())
    exact, _, _ = build("exact")
    try:
        export.to_onnx(exact, os.path.join(tempfile.gettempdir(), "exact.onnx"))
        report["exact_refusal"] = None
    except ValueError as error:
        report["exact_refusal"] = str(error)
    print(json.dumps(report, indent=2))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
