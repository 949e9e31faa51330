"""Real inputs for export checks: Fashion-MNIST test images as raw uint8 pixels, shaped for a served model.

The exported models take raw 0-255 pixels, so the checks feed the IDX file's bytes as they are (uint8; the float
signature and ONNX get the same values as float32).
"""
import numpy as np

from training.data.fashion_mnist import load_fashion_mnist

FASHION_MNIST_SHAPE = (28, 28, 1)


def _check_image_shape(spec):
    for name, tensor_spec in zip(spec.input_names, spec.input_specs):
        if name in spec.pixel_inputs or spec.task == "generic":
            shape = tuple(tensor_spec.shape[1:])
            fits = len(shape) == 3 and all(d is None or d == f for d, f in zip(shape, FASHION_MNIST_SHAPE))
            if not fits:
                raise ValueError(f"`model`: input {name!r} takes shape {shape}; the checks feed Fashion-MNIST "
                                 f"images of shape {FASHION_MNIST_SHAPE}.")


def fashion_mnist_inputs(spec, count=64, classes=None, shots=1):
    """``{input name: array}`` of real test images for ``spec`` (an :class:`export.signatures.ServingSpec`).

    Classification, retrieval and single-input generic models: the first ``count`` test images whose label is in
    ``classes`` (default: all). Few-shot: ``count`` query images of ``classes`` (default the first ``ways``
    classes) and a support set of the ``shots`` test images per class that follow the queries, labelled by the
    class's position in ``classes``. Raises ``ValueError`` naming ``model`` when its inputs are not 28x28x1 images.
    """
    if spec.task == "generic" and len(spec.input_names) != 1:
        raise ValueError(f"`model` has {len(spec.input_names)} inputs; Fashion-MNIST checks need one image input "
                         "or a few-shot model (pass task='few_shot').")
    _check_image_shape(spec)
    images, labels = load_fashion_mnist("test", normalize=False)
    if spec.task != "few_shot":
        keep = np.flatnonzero(np.isin(labels, classes)) if classes is not None else np.arange(len(labels))
        return {spec.input_names[0]: images[keep[:count]]}
    ways = int(spec.output_shapes[0][-1])
    classes = list(classes) if classes is not None else list(range(ways))
    if len(classes) != ways:
        raise ValueError(f"`classes`: a {ways}-way model needs {ways} classes, got {classes}.")
    keep = np.flatnonzero(np.isin(labels, classes))
    queries = keep[:count]
    rest = keep[count:]
    support = np.concatenate([rest[labels[rest] == c][:shots] for c in classes])
    lookup = {c: i for i, c in enumerate(classes)}
    return {"query_images": images[queries], "support_images": images[support],
            "support_labels": np.array([lookup[int(c)] for c in labels[support]], np.int32)}
