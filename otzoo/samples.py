"""Real inputs for export checks: test images of a data set as raw uint8 pixels, shaped for a served model.

The exported models take raw 0-255 pixels, so the checks feed the images as stored (uint8; the float signature and
ONNX get the same values as float32): Fashion-MNIST's IDX bytes, or a TFDS data set's test images at the model's
input size (``training.data.datasets``).
"""
import numpy as np

from training.data.datasets import image_arrays, input_shape_of

TFDS_TEST_IMAGES = 4096  # the first images of a TFDS test split read for the checks (IDX files: all of them)


def _check_image_shape(spec, dataset, image_shape):
    for name, tensor_spec in zip(spec.input_names, spec.input_specs):
        if name in spec.pixel_inputs or spec.task == "generic":
            shape = tuple(tensor_spec.shape[1:])
            fits = len(shape) == 3 and all(d is None or d == f for d, f in zip(shape, image_shape))
            if not fits:
                raise ValueError(f"`model`: input {name!r} takes shape {shape}; the checks feed {dataset} test "
                                 f"images of shape {image_shape}.")


def sample_inputs(spec, count=64, classes=None, shots=1, dataset="fashion_mnist", image_size=None, data_dir=None):
    """``{input name: array}`` of real test images of ``dataset`` for ``spec`` (an
    :class:`export.signatures.ServingSpec`); ``image_size``: the side of a TFDS data set's images (default the data
    set's), ``data_dir``: where TFDS finds it.

    Classification, retrieval and single-input generic models: the first ``count`` test images whose label is in
    ``classes`` (default: all). Few-shot, over the first ``ways`` of ``classes`` (default ``0..ways-1``): a support
    set of the first ``shots`` test images of each class, labelled by the class's position in ``classes``, and up
    to ``count`` query images of those classes besides the support set. Raises ``ValueError`` naming ``model`` when
    its inputs do not take the data set's images, and naming ``classes`` when the images read hold too few of them.
    """
    if spec.task == "generic" and len(spec.input_names) != 1:
        raise ValueError(f"`model` has {len(spec.input_names)} inputs; the checks need one image input or a "
                         "few-shot model (pass task='few_shot').")
    _check_image_shape(spec, dataset, input_shape_of(dataset, image_size))
    limit = None if dataset == "fashion_mnist" else TFDS_TEST_IMAGES
    images, labels = image_arrays(dataset, "test", limit=limit, image_size=image_size, data_dir=data_dir)
    if spec.task != "few_shot":
        keep = np.flatnonzero(np.isin(labels, classes)) if classes is not None else np.arange(len(labels))
        if len(keep) == 0:
            raise ValueError(f"`classes`: none of {list(classes)} among the {len(labels)} {dataset} test images read.")
        return {spec.input_names[0]: images[keep[:count]]}
    ways = int(spec.output_shapes[0][-1])
    classes = list(classes)[:ways] if classes is not None else list(range(ways))
    if len(classes) != ways:
        raise ValueError(f"`classes`: a {ways}-way model needs {ways} classes, got {classes}.")
    support = [np.flatnonzero(labels == c)[:shots] for c in classes]
    if any(len(s) < shots for s in support):
        raise ValueError(f"`classes`: the {len(labels)} {dataset} test images read hold fewer than {shots} "
                         f"support image(s) of each of {classes}.")
    support = np.concatenate(support)
    queries = np.setdiff1d(np.flatnonzero(np.isin(labels, classes)), support)[:count]
    if len(queries) == 0:
        raise ValueError(f"`classes`: the {len(labels)} {dataset} test images read hold no query image of "
                         f"{classes} beside the support set.")
    lookup = {c: i for i, c in enumerate(classes)}
    return {"query_images": images[queries], "support_images": images[support],
            "support_labels": np.array([lookup[int(c)] for c in labels[support]], np.int32)}
