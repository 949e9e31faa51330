"""``explain_model``: every picture that fits a model in memory, written into one folder (the Python twin of
``otzoo explain``)."""
import os

import numpy as np

from explain import plots, signals
from explain.images import model_input_shape, prepare_images
from ot_layers.layers.emd_head import EMDHead
from ot_layers.layers.generalized_sum_pooling import GeneralizedSumPooling
from ot_layers.layers.hyperspherical_prototypes import HypersphericalPrototypes
from ot_layers.layers.multi_proxy_wasserstein import MultiProxyWasserstein
from ot_layers.tensor_ops import walk_layers

KINDS = ("mpw", "gsp", "emd", "prototypes", "retrieval", "curves")
_LAYERS = {"mpw": MultiProxyWasserstein, "gsp": GeneralizedSumPooling, "emd": EMDHead,
           "prototypes": HypersphericalPrototypes}


def _has(model, layer_class):
    return any(isinstance(layer, layer_class) for layer in walk_layers(model, include_self=True))


def available_kinds(model, logs=None, meta_training=None):
    """The kinds of :data:`KINDS` that fit ``model``: a kind per layer it holds (``mpw``, ``gsp``, ``emd``,
    ``prototypes``), ``retrieval`` for a single-input image model, ``curves`` when ``logs`` or a few-shot model's
    ``meta_training`` history are given."""
    kinds = [kind for kind, layer_class in _LAYERS.items() if _has(model, layer_class)]
    if len(model.inputs) == 1:
        kinds.append("retrieval")
    if logs or meta_training:
        kinds.append("curves")
    return [kind for kind in KINDS if kind in kinds]


def why_not(kind, model):
    """A sentence saying why ``kind`` does not fit ``model``."""
    if kind in _LAYERS:
        return f"the model has no {_LAYERS[kind].__name__} layer"
    if kind == "retrieval":
        return "retrieval needs a model with a single image input"
    return "no training log or meta-training history was given"


_NEEDS_IMAGES = ("mpw", "gsp", "emd", "retrieval")


def _missing_input(kind, images, gallery, support):
    """Why ``kind`` cannot be drawn from the inputs given (a sentence naming the argument), or ``None``."""
    if kind in _NEEDS_IMAGES and images is None:
        return f"`images`: kind {kind!r} draws images; give at least one."
    if kind == "retrieval" and gallery is None:
        return "`gallery`: kind 'retrieval' needs gallery images."
    if kind == "emd" and (not isinstance(support, (tuple, list)) or len(support) != 2):
        return "`support`: kind 'emd' needs the episode's (support_images, support_labels)."
    return None


def _check_against_model(model, kinds, labels, support, gallery, gallery_exclude, count, class_names):
    """What the kinds to draw need of the labels and the episode, checked before any plot runs the model: labels in
    the model's classes (the ways of a few-shot model), an episode's support labels ``0..ways-1``, one gallery
    index (or -1) per image to exclude, and a name for each class."""
    classes = plots.model_classes(model)
    if classes is not None and ("mpw" in kinds or "emd" in kinds):
        bad = [v for v in labels if v is not None and not 0 <= v < classes]
        if bad:
            raise ValueError(f"`labels` must be classes of the model, in 0..{classes - 1}, got {bad[:5]}.")
        plots.check_class_names(class_names, classes)
    if "emd" in kinds:
        signals.episode_labels(support[1], classes)
    if "retrieval" in kinds and gallery_exclude is not None:
        signals.check_exclude(gallery_exclude, count, len(gallery), "gallery_exclude")


def _emd_classes(logits, label):
    """(class, tag) pairs to draw for one query: its true class and the best other class, or the predicted and
    the runner-up when the label is unknown."""
    ranking = [int(c) for c in np.argsort(-logits, kind="stable")]
    if label is None:
        return [(ranking[0], "predicted"), (ranking[1], "runner_up")]
    other = next(c for c in ranking if c != int(label))
    return [(int(label), "true"), (other, "other")]


def explain_model(model, out, images=None, labels=None, names=None, kinds=None, class_names=None, gallery=None,
                  gallery_labels=None, gallery_exclude=None, support=None, logs=None, history=None, k=5, dpi=100,
                  meta_training=None):
    """Write the pictures of :data:`KINDS` that fit ``model`` into folder ``out``; returns ``{kind: [paths]}``.

    images: 0-255 images (a batch, or one image), fitted to the model's input; labels: their labels (or ``None``);
      names: one file-name stem per image (default ``image0``, ``image1``, ...).
    kinds: the kinds to draw (default: every kind :func:`available_kinds` finds whose inputs are given: retrieval
      with a ``gallery``, emd with a ``support``; a kind named twice is drawn once); asking for one that does not
      fit, or whose inputs are missing, raises ``ValueError`` naming it before anything is computed or written.
    class_names: label names (for a few-shot model: names of the episode labels ``0..ways-1``).
    gallery, gallery_labels, gallery_exclude: the retrieval gallery, its labels and per image a gallery index to
      skip (the image itself), or -1.
    support: ``(support_images, support_labels)`` of the few-shot episode the images are queries of (EMD).
    logs: a CSV log path, list or ``{name: path}`` (curves); history: the prototype assignment history.
    meta_training: a few-shot card's ``meta_training`` (``{"episode": [...], "loss": [...], ...}``; curves).
    k: neighbours in the retrieval panel; dpi: the PNGs' resolution (1 to ``plots.MAX_DPI``, 600).

    Per kind: ``mpw_<name>.png`` per image (predicted and true class), ``gsp.png`` (all images), ``emd_<name>_<tag>
    .png`` per image (its true and best other class, or predicted and runner-up), ``prototypes.png``,
    ``retrieval.png`` (all images as queries), ``curves.png`` (the logs) and ``meta_training.png`` (the episodes).
    """
    plots.check_dpi(dpi)  # before the explanations are computed
    fitting = available_kinds(model, logs, meta_training)
    given = dict(images=images, gallery=gallery, support=support)
    if kinds is None:
        kinds = [kind for kind in fitting if _missing_input(kind, **given) is None]
        if not kinds:
            raise ValueError(f"Nothing to draw for model {model.name!r}: its kinds ({', '.join(fitting)}) need "
                             "`images` (and `gallery` for retrieval, `support` for emd).")
    else:  # a kind named twice is drawn once, in the order of its first appearance
        kinds = list(dict.fromkeys(kinds)) if isinstance(kinds, (list, tuple)) else kinds
    for kind in kinds:  # every kind is checked before anything is computed or written
        if kind not in KINDS:
            raise ValueError(f"`kinds`: unknown kind {kind!r}; known kinds: {', '.join(KINDS)}.")
        if kind not in fitting:
            raise ValueError(f"`kinds`: {kind!r} does not fit model {model.name!r} ({why_not(kind, model)}); "
                             f"it fits: {', '.join(fitting)}.")
        missing = _missing_input(kind, **given)
        if missing is not None:
            raise ValueError(missing)
    batch = None
    if images is not None:
        batch = prepare_images(images, model_input_shape(model))
        labels = [None] * len(batch) if labels is None else [None if v is None else plots.check_label(v, "labels")
                                                             for v in labels]
        names = [f"image{i}" for i in range(len(batch))] if names is None else [str(n) for n in names]
        if len(labels) != len(batch) or len(names) != len(batch):
            raise ValueError(f"`labels` and `names` must have one entry per image ({len(batch)}).")
        if len(set(names)) != len(names):
            raise ValueError(f"`names` must be distinct (they name the files written), got {names}.")
        _check_against_model(model, kinds, labels, support, gallery, gallery_exclude, len(batch), class_names)
    os.makedirs(out, exist_ok=True)
    written = {}
    for kind in kinds:
        paths = []
        if kind == "mpw":
            for image, label, name in zip(batch, labels, names):
                paths.append(plots.plot_mpw_plans(model, image, os.path.join(out, f"mpw_{name}.png"), label=label,
                                                  class_names=class_names, dpi=dpi))
        elif kind == "gsp":
            known = None if all(v is None for v in labels) else labels
            paths.append(plots.plot_gsp_weights(model, batch, os.path.join(out, "gsp.png"), labels=known,
                                                class_names=class_names, dpi=dpi))
        elif kind == "emd":
            support_images, support_labels = support
            for image, label, name in zip(batch, labels, names):
                logits = signals.emd_flows(model, image[None], support_images, support_labels).logits[0]
                for cls, tag in _emd_classes(logits, label):
                    paths.append(plots.plot_emd_flows(
                        model, image, support_images, support_labels, os.path.join(out, f"emd_{name}_{tag}.png"),
                        class_index=cls, query_label=label, class_names=class_names, dpi=dpi))
        elif kind == "prototypes":
            paths.append(plots.plot_prototypes(model, os.path.join(out, "prototypes.png"), history=history,
                                               class_names=class_names, dpi=dpi))
        elif kind == "retrieval":
            # test images have their labels, image files none: their rows are grey, the others framed by class
            known = None if gallery_labels is None or all(v is None for v in labels) else labels
            paths.append(plots.plot_retrieval(model, batch, gallery, os.path.join(out, "retrieval.png"),
                                              query_labels=known, gallery_labels=gallery_labels, k=k,
                                              exclude=gallery_exclude, class_names=class_names, dpi=dpi))
        elif kind == "curves":
            if logs:
                paths.append(plots.plot_training_curves(logs, os.path.join(out, "curves.png"), dpi=dpi))
            if meta_training:
                paths.append(plots.plot_training_curves({"meta-training": meta_training},
                                                        os.path.join(out, "meta_training.png"), dpi=dpi))
        written[kind] = paths
    return written
