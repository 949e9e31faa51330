"""EDMS ensembles (Aziere and Todorovic 2019): random meta-class partitions per learner and the concatenated
embedding."""
import keras
import numpy as np

from ot_layers.names import unique_names
from ot_layers.validation import check_positive_int, check_seed


def meta_class_partitions(num_classes, num_meta_classes, num_learners=1, seed=0):
    """``(num_learners, num_classes)`` int array: for each learner a random partition of the classes into
    ``num_meta_classes`` non-empty meta-classes of (almost) equal size; entry ``[e, c]`` is class ``c``'s
    meta-class for learner ``e`` (Aziere and Todorovic 2019, Sec. 4.1)."""
    num_classes = check_positive_int("num_classes", num_classes)
    num_meta_classes = check_positive_int("num_meta_classes", num_meta_classes)
    num_learners = check_positive_int("num_learners", num_learners)
    if num_meta_classes > num_classes:
        raise ValueError(f"`num_meta_classes` ({num_meta_classes}) must not exceed `num_classes` ({num_classes}).")
    rng = np.random.default_rng(check_seed("seed", seed))
    partitions = np.empty((num_learners, num_classes), dtype=np.int32)
    for e in range(num_learners):
        partitions[e, rng.permutation(num_classes)] = np.arange(num_classes) % num_meta_classes
    return partitions


def _uniquely_named(learners):
    """The ``learners``, each whose name an earlier one has (the zoo's builders name every model of one kind alike)
    as a functional model of it (the same layers and weights) under the name :func:`unique_names` gives it: Keras
    refuses a model whose layers share a name."""
    names = unique_names([learner.name for learner in learners])
    return [learner if name == learner.name else keras.Model(learner.inputs[0], learner.outputs[0], name=name)
            for learner, name in zip(learners, names)]


def ensemble_embedding_model(learners, name="edms_ensemble"):
    """One model concatenating the L2-normalized embeddings of the ``learners`` (models with the same input, each a
    model of its own; those named alike are wrapped under unique names), scaled by ``1/sqrt(E)`` so the result is a
    unit vector (Aziere and Todorovic 2019, Sec. 3, eq. 1)."""
    if not isinstance(learners, (list, tuple)) or not learners:
        raise ValueError(f"`learners` must be a non-empty list of embedding models, got {learners!r}.")
    shapes = []
    for index, learner in enumerate(learners):
        if not isinstance(learner, keras.Model) or not getattr(learner, "inputs", None) \
                or len(learner.inputs) != 1 or len(learner.outputs) != 1:
            raise ValueError(f"`learners`[{index}] must be a built keras.Model with one input and one output, got "
                             f"{learner!r}.")
        if len(learner.outputs[0].shape) != 2:  # a feature map would be normalized per position, not a unit vector
            raise ValueError(f"`learners`[{index}] must output embeddings (batch, d), got shape "
                             f"{tuple(learner.outputs[0].shape)}.")
        shapes.append(tuple(learner.inputs[0].shape[1:]))
    if len(set(shapes)) != 1:
        raise ValueError(f"`learners` must take the same input, got input shapes {shapes}.")
    repeated = [i for i, learner in enumerate(learners) if any(learner is other for other in learners[:i])]
    if repeated:
        raise ValueError(f"`learners`[{repeated[0]}] is an earlier learner again: an ensemble of independent "
                         "learners needs one model each (build another).")
    inputs = keras.Input(shapes[0], name="images")
    parts = [keras.layers.UnitNormalization(name=f"normalize_{i}")(learner(inputs))
             for i, learner in enumerate(_uniquely_named(learners))]
    joined = parts[0] if len(parts) == 1 else keras.layers.Concatenate(name="concatenate")(parts)
    return keras.Model(inputs, keras.layers.Rescaling(1.0 / np.sqrt(len(learners)), name="scale")(joined), name=name)
