"""The validation parts ``otzoo tune`` carves from a preset's *training* images to score its trials (the test split
is never read): a class-stratified share of the images (:func:`validation_split`, classification) or whole seen
classes held out (:func:`held_out_classes_split`, the retrieval protocol one level down). Each recipe module's
``tuning_data`` chooses one.
"""
import numpy as np

from ot_layers.validation import check_in_range
from training.data.errors import EmptySliceError

VALIDATION_IMAGES_PER_CLASS = 1000  # retrieval: images of each held-out class that score a trial


def validation_split(images, labels, fraction=0.2, seed=0):
    """``(train_images, train_labels), (val_images, val_labels)``: a seeded, class-stratified ``fraction`` of the
    given *training* examples held out for scoring trials (each class keeps at least one training example)."""
    fraction = check_in_range("validation_fraction", fraction, 0.0, 1.0, low_open=True, high_open=True)
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    held = []
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        count = min(len(members) - 1, int(round(fraction * len(members))))
        held.extend(members[:count].tolist())
    held = np.sort(np.asarray(held, dtype=np.int64))
    if len(held) == 0:
        raise EmptySliceError(f"`validation_fraction` {fraction} of {len(labels)} examples holds out no example; "
                              "use more examples (`limit`) or a larger fraction.")
    keep = np.setdiff1d(np.arange(len(labels)), held)
    return (images[keep], labels[keep]), (images[held], labels[held])


def held_out_classes_split(images, labels, fraction=0.2, per_class=VALIDATION_IMAGES_PER_CLASS):
    """The retrieval protocol on the seen classes: ``(fit_images, fit_labels), (val_images, val_labels)``.

    The last ``max(2, round(fraction * C))`` of the ``C`` classes in ``labels`` are held out: their first
    ``per_class`` images (original labels) score the trial by retrieval among unseen classes; the other classes'
    images train it (labels ``0..C'-1`` in increasing order). At least two classes must remain to train on."""
    fraction = check_in_range("validation_fraction", fraction, 0.0, 1.0, low_open=True, high_open=True)
    labels = np.asarray(labels)
    classes = np.unique(labels)
    count = max(2, int(round(fraction * len(classes))))
    if len(classes) - count < 2:
        raise EmptySliceError(f"`validation_fraction` {fraction}: holding out {count} of the {len(classes)} seen "
                              "classes leaves fewer than two to train on; use more classes or a smaller fraction.")
    fit_classes, val_classes = classes[:-count], classes[-count:]
    fit_mask = np.isin(labels, fit_classes)
    relabel = np.searchsorted(fit_classes, labels[fit_mask]).astype(np.int32)
    held = np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in val_classes])
    return (images[fit_mask], relabel), (images[held], labels[held])


def carve_validation(split, images, labels, limit, *args):
    """``split(images, labels, *args)``, its :class:`EmptySliceError` naming ``limit`` when one was given (the
    first ``limit`` training images were too few to split)."""
    try:
        return split(images, labels, *args)
    except EmptySliceError as error:
        if limit is None:
            raise
        raise EmptySliceError(f"{len(labels)} training images; {error}", "limit", limit) from None
