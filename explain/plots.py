"""Matplotlib pictures of what the layers do, each written as a PNG (Agg, no display needed).

Every ``plot_*`` function takes a model in memory (or a log), images as 0-255 pixels (fitted to the model's input by
:func:`explain.images.prepare_images`), and ``path``; it writes one PNG and returns ``path``. The figures are grids
of square panels of ``PANEL_INCHES`` (``2 * PANEL_INCHES`` for the matrix and curve plots) with a
``HEADER_INCHES`` title band on top, so a PNG is ``cols * panel * dpi`` by ``(rows * panel + HEADER_INCHES) * dpi``
pixels (:func:`figure_pixels`); each docstring gives its ``cols`` and ``rows``. Heat maps over an image are the
layer's per-cell quantities on its ``h x w`` feature map, upsampled bilinearly to the image size.

The drawing uses ``matplotlib.figure.Figure`` directly (no ``pyplot`` state), which renders with Agg. Matplotlib
comes with the ``explain`` extra and is imported when a picture is drawn (``import explain`` works without it).
"""
import numbers
import os

import numpy as np

from explain import signals
from explain.images import model_input_shape, prepare_images, upsample
from ot_layers.layers.generalized_sum_pooling import GeneralizedSumPooling
from ot_layers.layers.multi_proxy_wasserstein import MultiProxyWasserstein
from ot_layers.optional import require
from ot_layers.tensor_ops import find_layer
from ot_layers.validation import check_output_path, check_positive_int

PANEL_INCHES = 1.8
HEADER_INCHES = 0.5
FONT_SIZE = 7
RIGHT = "#1a9850"  # frame of a retrieved image of the query's class
WRONG = "#d73027"  # frame of one of another class
UNKNOWN = "#808080"  # frame when the labels are not known
FLOW_COLOR = "#ff7f0e"
STEP_COLUMNS = ("epoch", "episode")  # a Keras log's x axis (0-based epochs); a meta-training history's (episodes)


MAX_DPI = 600  # print resolution; a top-k figure of 10 panels at 600 dpi is ~12,000 pixels wide (~0.5 GB in memory)


def check_dpi(dpi):
    """``dpi`` must be an integer in ``1 .. MAX_DPI``: beyond it a figure outgrows matplotlib's 2**16-pixel side or
    the memory, after the explanation was computed."""
    dpi = check_positive_int("dpi", dpi)
    if dpi > MAX_DPI:
        raise ValueError(f"`dpi` must be an integer <= {MAX_DPI}, got {dpi!r}.")
    return dpi


def check_label(label, name="label"):
    """An integer class label (a Python or NumPy integer, or a whole float) as ``int``, else a ``ValueError`` naming
    ``name`` (``int()`` would turn 1.7 into 1 and "b" into an error naming nothing)."""
    if isinstance(label, (bool, np.bool_)) or not isinstance(label, numbers.Real) \
            or not np.isfinite(label) or label != int(label):
        raise ValueError(f"`{name}` must be an integer class label, got {label!r}.")
    return int(label)


def check_output(path, dpi, class_names=None):
    """The arguments every plot shares, checked before the model runs: ``dpi`` (:func:`check_dpi`), ``path`` (a
    file path whose folder can be made: not a directory, no file on the way; :func:`check_output_path`; ending in
    ``.png``, or without an extension) and
    ``class_names`` (``None`` or a sequence of names, not one string)."""
    check_dpi(dpi)
    check_output_path("path", path, directory=False)
    extension = os.path.splitext(os.fspath(path))[1]
    if extension and extension.lower() != ".png":  # PNG bytes were written under any extension: a.jpg held a PNG
        raise ValueError(f"`path` must name a PNG file (the pictures are PNG), got {os.fspath(path)!r}: end it "
                         "in .png.")
    if class_names is not None and (isinstance(class_names, (str, bytes)) or not hasattr(class_names, "__len__")):
        raise ValueError(f"`class_names` must be a sequence of names, one per class, got {class_names!r}.")


def model_classes(model):
    """The number of classes (a few-shot model's ways) of a single-output model, from its output shape; ``None``
    when not known before the model runs."""
    outputs = getattr(model, "outputs", None) or ()
    return outputs[0].shape[-1] if len(outputs) == 1 else None


def check_class_names(class_names, num_classes):
    """``class_names``, when given, must name each of ``num_classes`` classes."""
    if class_names is not None and len(class_names) < num_classes:
        raise ValueError(f"`class_names` has {len(class_names)} names for {num_classes} classes.")


def figure_pixels(cols, rows, panel=PANEL_INCHES, dpi=100):
    """``(width, height)`` in pixels of a figure of ``cols x rows`` panels of ``panel`` inches at ``dpi``."""
    return int(round(cols * panel * dpi)), int(round((rows * panel + HEADER_INCHES) * dpi))


def _matplotlib(module):
    """``matplotlib.<module>``, or one line naming ``otzoo[explain]`` when matplotlib is not installed."""
    return require(f"matplotlib.{module}", "explain", "drawing explain pictures")


def _figure(cols, rows, panel=PANEL_INCHES, margin=0.0):
    """A figure of ``cols x rows`` panels; ``margin`` (inches) is kept free left of and below the panels for tick
    labels (inside the panels' area: the figure's size does not change)."""
    width, height = cols * panel, rows * panel + HEADER_INCHES
    figure = _matplotlib("figure").Figure(figsize=(width, height))
    top = 1.0 - (HEADER_INCHES + 0.1) / height
    figure.subplots_adjust(left=(0.07 + margin) / width, right=1.0 - 0.07 / width, bottom=(0.07 + margin) / height,
                           top=top, wspace=0.3 + 0.5 * margin, hspace=0.45)
    return figure


TITLE_POINTS = 20.0  # the height a figure's title may take in the header band, above the panels' own titles


def _title_lines(title, width_inches):
    """``(text, font size)`` of a figure's title: wrapped at words to the figure's width, at ``FONT_SIZE + 1`` or
    smaller, so that its lines fit :data:`TITLE_POINTS` (a figure of one or two panels cut a long title off at both
    sides: ``otzoo explain``'s GSP picture of one image lost its first and last words)."""
    measure = _matplotlib("textpath").TextToPath()
    font = _matplotlib("font_manager").FontProperties
    room = 0.92 * width_inches * 72.0  # points on one line
    words = str(title).split(" ")
    for size in np.arange(FONT_SIZE + 1.0, 3.9, -0.5):  # 8, 7.5, ..., 4 points
        props = font(size=size)
        lines, current = [], ""
        for word in words:
            candidate = f"{current} {word}" if current else word
            if current and measure.get_text_width_height_descent(candidate, props, ismath=False)[0] > room:
                lines.append(current)
                candidate = word
            current = candidate
        lines.append(current)
        if len(lines) * 1.2 * size <= TITLE_POINTS:
            break
    return "\n".join(lines), float(size)


def _save(figure, path, dpi, title):
    dpi = check_dpi(dpi)
    text, size = _title_lines(title, figure.get_figwidth())
    figure.suptitle(text, fontsize=size, y=1.0 - 0.08 * HEADER_INCHES / figure.get_figheight())
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    figure.savefig(path, dpi=dpi, format="png")
    return path


def _name(label, class_names):
    if label is None:
        return "?"
    label = int(label)
    return class_names[label] if class_names is not None and 0 <= label < len(class_names) else str(label)


def _plain(ax):
    ax.set_xticks([])
    ax.set_yticks([])


def _show_image(ax, image):
    """An ``(H, W, C)`` 0-255 image; grayscale for one channel."""
    if image.shape[-1] == 1:
        ax.imshow(image[..., 0], cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    else:
        ax.imshow(np.clip(image / 255.0, 0, 1), interpolation="nearest")
    _plain(ax)


def _overlay(ax, image, cells, grid, cmap, vmin=None, vmax=None, alpha=0.6, norm=None):
    """``cells`` ``(h*w,)`` drawn as a heat map over ``image`` (upsampled to its size); returns the heat map."""
    _show_image(ax, image)
    heat = upsample(np.reshape(cells, grid), image.shape[:2])
    if norm is not None:
        return ax.imshow(heat, cmap=cmap, norm=norm, alpha=alpha, interpolation="nearest")
    return ax.imshow(heat, cmap=cmap, vmin=vmin, vmax=vmax, alpha=alpha, interpolation="nearest")


def _need_grid(grid, what):
    if grid is None:
        raise ValueError(f"`model`: the {what} receives a set (B, n, d), not a feature map (B, h, w, d), so its "
                         "values cannot be drawn over the image.")


def _one_image(model, image):
    batch = prepare_images(image, model_input_shape(model))
    if batch.shape[0] != 1:
        raise ValueError(f"`image` must be one image, got a batch of {batch.shape[0]}.")
    return batch


def plot_mpw_plans(model, image, path, label=None, class_names=None, layer_name=None, dpi=100):
    """The MPW head's transport plans of ``image`` for the predicted class and the true class ``label``.

    Two rows (the predicted class; then the true class, or the runner-up when ``label`` is ``None`` or predicted),
    ``2 + M`` columns (``M`` proxies per class): the image; each cell's share of the class logit
    ``sum_m T[j, m] <x_j, p_m>`` (red adds to the logit, blue subtracts); then for every proxy ``m`` the cells it
    takes mass from, ``M * T[:, m]`` (sums to one over the cells), titled with its part of the logit.
    """
    check_output(path, dpi, class_names)
    label = None if label is None else check_label(label)
    classes = model_classes(model)
    if label is not None and classes is not None and not 0 <= label < classes:  # before the model runs
        raise ValueError(f"`label` must be a class of the model, in 0..{classes - 1}, got {label}.")
    batch = _one_image(model, image)
    result = signals.mpw_plans(model, batch, layer_name)
    _need_grid(result.grid, "MultiProxyWasserstein head")
    logits = result.logits[0]
    check_class_names(class_names, len(logits))
    if label is not None and not 0 <= label < len(logits):
        raise ValueError(f"`label` must be a class of the model, in 0..{len(logits) - 1}, got {label}.")
    ranking = np.argsort(-logits, kind="stable")
    predicted = int(ranking[0])
    if label is not None and label != predicted:
        rows = [(predicted, "predicted"), (label, "true")]
    else:
        rows = [(predicted, "predicted" if label is None else "predicted = true"), (int(ranking[1]), "runner-up")]
    plans, inner = result.plans[0], result.inner[0]
    contributions = result.contributions()[0]
    num_proxies = plans.shape[-1]
    limit = max(float(np.max(np.abs(contributions[[c for c, _ in rows]]))), 1e-12)
    picture = batch[0]
    figure = _figure(2 + num_proxies, 2)
    axes = figure.subplots(2, 2 + num_proxies, squeeze=False)
    for row, (cls, tag) in enumerate(rows):
        _show_image(axes[row, 0], picture)
        axes[row, 0].set_title(f"{tag}: {_name(cls, class_names)}\nlogit {logits[cls]:.2f}", fontsize=FONT_SIZE)
        _overlay(axes[row, 1], picture, contributions[cls], result.grid, "RdBu_r", -limit, limit)
        axes[row, 1].set_title("cells' share of\nthe logit", fontsize=FONT_SIZE)
        mass = num_proxies * plans[cls]
        top = max(float(mass.max()), 1e-12)
        for m in range(num_proxies):
            ax = axes[row, 2 + m]
            _overlay(ax, picture, mass[:, m], result.grid, "inferno", 0.0, top)
            part = float(np.sum(plans[cls, :, m] * inner[cls, :, m]))
            ax.set_title(f"proxy {m + 1}\n{part:+.2f} of the logit", fontsize=FONT_SIZE)
    layer = find_layer(model, MultiProxyWasserstein, layer_name)
    h, w = result.grid
    title = (f"MPW transport plans: {h}x{w} cells x {num_proxies} proxies per class "
             f"(Sinkhorn epsilon {layer.matcher.epsilon:g})")
    return _save(figure, path, dpi, title)


def plot_gsp_weights(model, images, path, labels=None, class_names=None, layer_name=None, dpi=100):
    """The GSP layer's pooling weights over each of ``images``: ``B`` columns, two rows (the image; the weights
    times the cell count ``n``, so 1 is global average pooling's weight (white), 0 an ignored cell (blue) and red
    a cell weighted above average). ``labels``: one per image, ``None`` for an image of unknown class (titled by
    its position, as without ``labels``)."""
    check_output(path, dpi, class_names)
    batch = prepare_images(images, model_input_shape(model))
    if labels is not None:  # an image file's label is unknown beside a test image's (``otzoo explain``)
        labels = [None if v is None else check_label(v, "labels")
                  for v in np.asarray(labels, dtype=object).reshape(-1)]
    result = signals.gsp_weights(model, batch, layer_name)
    _need_grid(result.grid, "GeneralizedSumPooling layer")
    n = result.weights.shape[1]
    scaled = result.weights * n
    norm = _matplotlib("colors").TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=max(2.0, float(scaled.max())))
    count = batch.shape[0]
    figure = _figure(count, 2)
    axes = figure.subplots(2, count, squeeze=False)
    labels = [None] * count if labels is None else labels
    if len(labels) != count:
        raise ValueError(f"`labels` has {len(labels)} entries for {count} images.")
    heat = None
    for i in range(count):
        _show_image(axes[0, i], batch[i])
        axes[0, i].set_title(_name(labels[i], class_names) if labels[i] is not None else f"image {i}",
                             fontsize=FONT_SIZE)
        heat = _overlay(axes[1, i], batch[i], scaled[i], result.grid, "RdBu_r", norm=norm)
        selected = int(np.sum(result.weights[i] > 1.0 / n))
        axes[1, i].set_title(f"max {scaled[i].max():.1f}x GAP\n{selected}/{n} cells above GAP", fontsize=FONT_SIZE)
    bar = figure.colorbar(heat, ax=list(axes[1, :]), shrink=0.8, pad=0.02)
    bar.ax.tick_params(labelsize=FONT_SIZE - 1)
    layer = find_layer(model, GeneralizedSumPooling, layer_name)
    title = (f"GSP pooling weights x n ({result.grid[0]}x{result.grid[1]} cells, transport ratio "
             f"{layer.transport_ratio:g}, {layer.num_prototypes} prototypes; 1 = average pooling)")
    return _save(figure, path, dpi, title)


def _cell_centres(grid, size, offset=0.0):
    """Pixel coordinates ``(n, 2)`` (x, y) of the centres of a ``grid`` of cells over an image of ``size``."""
    h, w = grid
    ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    x = (xs.reshape(-1) + 0.5) * size[1] / w - 0.5 + offset
    y = (ys.reshape(-1) + 0.5) * size[0] / h - 0.5
    return np.stack([x, y], axis=1)


def plot_emd_flows(model, query_image, support_images, support_labels, path, class_index=None, query_label=None,
                   class_names=None, max_lines=30, layer_name=None, dpi=100):
    """EMD flows between a query and the support of one class, and both sides' node weights.

    ``model``: a few-shot EMD model (``zoo.few_shot_model(..., head="emd")``); ``support_labels`` are episode labels
    ``0..ways-1`` and ``class_names`` names them. ``class_index``: the class to draw (default: the predicted one).
    Three columns, two rows: on top, the query and the class's first support image side by side with a line for
    each of the ``max_lines`` largest flows between cell centres (width by flow; for several shots the flows go to
    the class-mean feature map); below, the node weights of the query and of the support (cross-reference or
    uniform, times the node count: 1 is a uniform weight) and the whole flow matrix ``T`` (query cells x support
    cells, row-major over the feature map).
    """
    check_output(path, dpi, class_names)
    class_index = None if class_index is None else check_label(class_index, "class_index")
    query_label = None if query_label is None else check_label(query_label, "query_label")
    max_lines = check_positive_int("max_lines", max_lines)
    query = _one_image(model, query_image)
    shape = model_input_shape(model)
    support = prepare_images(support_images, shape)
    labels = signals.episode_labels(support_labels, model_classes(model))  # before the model runs (ways known)
    result = signals.emd_flows(model, query, support, labels, layer_name)
    _need_grid(result.query_grid, "EMD head's query")
    _need_grid(result.support_grid, "EMD head's support")
    logits = result.logits[0]
    check_class_names(class_names, len(logits))
    cls = int(np.argmax(logits)) if class_index is None else class_index
    if not 0 <= cls < len(logits):
        raise ValueError(f"`class_index` must lie in [0, {len(logits) - 1}], got {class_index!r}.")
    members = np.flatnonzero(labels == cls)
    if len(members) == 0:
        raise ValueError(f"`support_labels` hold no support image of class {cls}.")
    plan = result.plans[0, cls]
    picture, shown = query[0], support[members[0]]
    gap = max(2, picture.shape[1] // 8)
    canvas = np.concatenate([picture, np.full((picture.shape[0], gap, picture.shape[2]), 255.0, np.float32), shown],
                            axis=1)
    figure = _figure(3, 2, margin=0.2)
    grid = figure.add_gridspec(2, 3)
    top = figure.add_subplot(grid[0, :])
    _show_image(top, canvas)
    source = _cell_centres(result.query_grid, picture.shape[:2])
    target = _cell_centres(result.support_grid, shown.shape[:2], offset=picture.shape[1] + gap)
    order = np.argsort(-plan, axis=None, kind="stable")[:max_lines]
    largest = max(float(plan.max()), 1e-12)
    for flat in order:
        i, j = np.unravel_index(flat, plan.shape)
        top.plot([source[i, 0], target[j, 0]], [source[i, 1], target[j, 1]], color=FLOW_COLOR,
                 linewidth=0.3 + 2.7 * plan[i, j] / largest, alpha=0.85)
    share = float(plan.reshape(-1)[order].sum() / max(plan.sum(), 1e-12))
    shots = f"mean of {len(members)} shots, first shown" if len(members) > 1 else "1 shot"
    top.set_title(f"query -> {_name(cls, class_names)} ({shots}): logit {logits[cls]:.2f}; the {len(order)} "
                  f"largest flows carry {share:.0%} of the mass", fontsize=FONT_SIZE)
    for col, (image, weights, grid_hw, side) in enumerate((
            (picture, result.query_weights[0, cls], result.query_grid, "query"),
            (shown, result.support_weights[0, cls], result.support_grid, "support"))):
        ax = figure.add_subplot(grid[1, col])
        scaled = weights * weights.shape[0]
        _overlay(ax, image, scaled, grid_hw, "viridis", 0.0, max(float(scaled.max()), 1e-12))
        ax.set_title(f"{side} node weights x n\n(max {scaled.max():.1f})", fontsize=FONT_SIZE)
    ax = figure.add_subplot(grid[1, 2])
    ax.imshow(plan * plan.size, cmap="magma", interpolation="nearest", aspect="auto")
    ax.set_xlabel("support cell", fontsize=FONT_SIZE - 1)
    ax.set_ylabel("query cell", fontsize=FONT_SIZE - 1)
    ax.tick_params(labelsize=FONT_SIZE - 2)
    ax.set_title(f"flows T x n m\n(max {plan.max() * plan.size:.0f})", fontsize=FONT_SIZE)
    predicted = int(np.argmax(logits))
    truth = "" if query_label is None else f", true {_name(query_label, class_names)}"
    title = f"EMD flows and node weights (query predicted {_name(predicted, class_names)}{truth})"
    return _save(figure, path, dpi, title)


def _matrix(ax, matrix, names, title, vmin=-1.0, vmax=1.0, annotate=True, fmt="{:.2f}", cmap="RdBu_r",
            xlabel=None, ylabel=None, yticks=None, aspect="equal"):
    image = ax.imshow(matrix, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest", aspect=aspect)
    rows, cols = matrix.shape
    ax.set_xticks(range(cols))
    ax.set_xticklabels(names[:cols], rotation=90, fontsize=FONT_SIZE - 1)
    ax.set_yticks(range(rows))
    ax.set_yticklabels(yticks if yticks is not None else names[:rows], fontsize=FONT_SIZE - 1)
    if annotate and rows * cols <= 400:
        for (r, c), value in np.ndenumerate(matrix):
            ax.text(c, r, fmt.format(value), ha="center", va="center", fontsize=FONT_SIZE - 2)
    ax.set_title(title, fontsize=FONT_SIZE)
    if xlabel:
        ax.set_xlabel(xlabel, fontsize=FONT_SIZE - 1)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=FONT_SIZE - 1)
    return image


def plot_prototypes(model, path, history=None, class_names=None, layer_name=None, dpi=100):
    """A ``HypersphericalPrototypes`` layer's prototype geometry, one row of ``2 * PANEL_INCHES`` panels:

    the cosine matrix of the classes' assigned prototypes; when the layer holds class representatives (after
    training with labels), the cosines between representatives and assigned prototypes (a diagonal of ones is a
    perfect fit); when ``history`` is given, the assignment over epochs (a list of assignments, e.g.
    ``explain.AssignmentHistory().assignments``, drawn as epochs x classes) or the per-epoch counts of changed
    classes (``PrototypeReassignment.changes`` or a CSV log with ``prototype_changes``; an epoch without a count, an
    empty or NA cell, gets no bar). ``model``: a model holding the layer, or the layer.
    """
    check_output(path, dpi, class_names)
    geometry = signals.prototype_geometry(model, layer_name)
    count = geometry.cosines.shape[0]
    check_class_names(class_names, count)
    names = [_name(k, class_names) for k in range(count)]
    assignments = None
    changes = None
    if history is not None:
        if not isinstance(history, (str, os.PathLike)) and np.asarray(history).ndim == 2:
            assignments = np.asarray(history)
            if assignments.shape[1] != count:
                raise ValueError(f"`history`: assignments of {assignments.shape[1]} classes for a layer of {count}.")
            for epoch, row in enumerate(assignments):
                if not np.array_equal(np.sort(row), np.arange(count)):
                    raise ValueError(f"`history`: assignment {epoch} is no permutation of 0..{count - 1}: "
                                     f"{row.tolist()}.")
            assignments = assignments.astype(int)
        changes = signals.assignment_changes(history)
    panels = 1 + (geometry.alignment is not None) + (history is not None)
    panel = 2 * PANEL_INCHES
    figure = _figure(panels, 1, panel, margin=0.6)
    axes = figure.subplots(1, panels, squeeze=False)[0]
    off_diagonal = geometry.cosines[~np.eye(count, dtype=bool)]
    simplex = f"{-1.0 / (count - 1):.3f}" + ("" if geometry.assigned.shape[1] >= count - 1 else
                                             f" needs dim >= {count - 1}")
    _matrix(axes[0], geometry.cosines, names, f"cos(prototype of i, prototype of j)\noff-diagonal "
            f"{off_diagonal.min():.3f}..{off_diagonal.max():.3f} (simplex {simplex})")
    col = 1
    if geometry.alignment is not None:
        _matrix(axes[col], geometry.alignment, names, f"cos(class representative, prototype)\ndiagonal mean "
                f"{np.mean(np.diag(geometry.alignment)):.3f}", ylabel="representative of class",
                xlabel="prototype of class")
        col += 1
    if history is not None:
        ax = axes[col]
        if assignments is not None:
            epochs = [str(e) for e in range(len(assignments))]
            _matrix(ax, assignments, names, f"prototype row assigned to each class\nchanges per epoch: "
                    f"{list(int(c) for c in changes)}", vmin=0, vmax=max(count - 1, 1), fmt="{:d}",
                    cmap="tab20", ylabel="after epoch (0 = start)", yticks=epochs, aspect="auto")
        else:
            counts = np.asarray(changes, dtype=float)
            epochs = np.arange(1, len(counts) + 1)
            known = np.isfinite(counts)  # an epoch without a count (an empty log cell) gets no bar
            ax.bar(epochs[known], counts[known], color=UNKNOWN)
            ax.set_xlim(0.4, max(len(counts), 1) + 0.6)  # every epoch's place, with or without its bar
            # a count of classes: from 0, whole numbers (all-zero bars drew an axis from -0.04 to 0.04)
            ax.set_ylim(0, max(1, int(np.max(counts[known], initial=0))) * 1.05)
            ax.yaxis.set_major_locator(_matplotlib("ticker").MaxNLocator(integer=True))
            ax.xaxis.set_major_locator(_matplotlib("ticker").MaxNLocator(integer=True))
            ax.set_xlabel("epoch", fontsize=FONT_SIZE)
            ax.set_ylabel("classes that changed prototype", fontsize=FONT_SIZE)
            ax.tick_params(labelsize=FONT_SIZE - 1)
            missing = int(np.sum(~known))
            ax.set_title("assignment changes per epoch" + (f"\n({missing} epoch(s) without a count: no bar)"
                                                           if missing else ""), fontsize=FONT_SIZE)
    title = f"Hyperspherical prototypes: {count} classes on the unit sphere of dimension {geometry.assigned.shape[1]}"
    return _save(figure, path, dpi, title)


def _frame(ax, color, width=3.0):
    for spine in ax.spines.values():
        spine.set_visible(True)
        spine.set_edgecolor(color)
        spine.set_linewidth(width)


def plot_retrieval(model, query_images, gallery_images, path, query_labels=None, gallery_labels=None, k=5,
                   exclude=None, class_names=None, dpi=100):
    """Each query and its ``k`` nearest gallery images by cosine of the model's embeddings
    (:func:`explain.signals.image_embeddings`), framed green when of the query's class, red otherwise (grey
    without labels; ``query_labels`` may hold ``None`` for a query of unknown class, whose row is grey). ``Q`` rows
    (queries), ``1 + k`` columns. ``exclude``: per query a gallery index to skip (the query itself when it is in
    the gallery), or -1."""
    check_output(path, dpi, class_names)
    queries = prepare_images(query_images, model_input_shape(model))
    gallery = prepare_images(gallery_images, model_input_shape(model))
    query_embeddings, source = signals.image_embeddings(model, queries)
    gallery_embeddings, _ = signals.image_embeddings(model, gallery)
    indices, scores = signals.nearest_neighbours(query_embeddings, gallery_embeddings, k, exclude)
    known = query_labels is not None and gallery_labels is not None
    if known:
        query_labels = [None if v is None else check_label(v, "query_labels")
                        for v in np.asarray(query_labels, dtype=object).reshape(-1)]
        gallery_labels = [check_label(v, "gallery_labels") for v in np.asarray(gallery_labels).reshape(-1)]
        if len(query_labels) != len(queries) or len(gallery_labels) != len(gallery):
            raise ValueError("`query_labels` / `gallery_labels` must have one label per query / gallery image.")
    figure = _figure(1 + k, len(queries))
    axes = figure.subplots(len(queries), 1 + k, squeeze=False)
    hits = labelled = 0
    for row in range(len(queries)):
        row_known = known and query_labels[row] is not None
        labelled += int(row_known)
        _show_image(axes[row, 0], queries[row])
        _frame(axes[row, 0], "black", 1.0)
        axes[row, 0].set_title(f"query: {_name(query_labels[row], class_names)}" if row_known else "query",
                               fontsize=FONT_SIZE)
        for col in range(k):
            index = indices[row, col]
            ax = axes[row, 1 + col]
            _show_image(ax, gallery[index])
            if row_known:
                same = gallery_labels[index] == query_labels[row]
                hits += int(same)
                _frame(ax, RIGHT if same else WRONG)
                ax.set_title(f"{_name(gallery_labels[index], class_names)}\ncos {scores[row, col]:.2f}",
                             fontsize=FONT_SIZE)
            else:
                _frame(ax, UNKNOWN)
                ax.set_title(f"#{index}\ncos {scores[row, col]:.2f}", fontsize=FONT_SIZE)
    summary = f"; {hits}/{labelled * k} of the query's class" if labelled else ""
    title = f"Retrieval: top {k} of {len(gallery)} gallery images by cosine of {source}{summary}"
    return _save(figure, path, dpi, title)


def _log_items(logs):
    if isinstance(logs, (str, os.PathLike)):
        return [(os.path.basename(os.path.dirname(os.path.abspath(logs))) or "log", logs)]
    if isinstance(logs, dict):
        return list(logs.items())
    return [(os.path.basename(os.path.dirname(os.path.abspath(p))) or f"log {i}", p) for i, p in enumerate(logs)]


def _log_table(source):
    """A log's columns: a Keras CSV log's path read (``signals.read_training_log``), or an in-memory table such as
    a few-shot card's ``meta_training`` (``{"episode": [...], "loss": [...], ...}``) as float arrays."""
    if isinstance(source, (str, os.PathLike)):
        return signals.read_training_log(source)
    table = {name: np.asarray(values, dtype=float) for name, values in dict(source).items()}
    if not any(column in table for column in STEP_COLUMNS):
        raise ValueError(f"`logs`: a table needs one of the columns {STEP_COLUMNS}, got {sorted(table)}.")
    return table


def _steps(tables):
    """The x axis shared by ``tables``: ``(label, [values per table])``; Keras' 0-based epochs are drawn from 1."""
    kinds = {next(column for column in STEP_COLUMNS if column in table) for _, table in tables}
    if len(kinds) > 1:
        raise ValueError(f"`logs`: the logs count different steps ({', '.join(sorted(kinds))}); draw them apart.")
    label = kinds.pop()
    return label, [table[label] + 1 if label == "epoch" else table[label] for _, table in tables]


def curve_families(columns):
    """The metric names of a log's columns, ``loss`` first (``val_x`` and ``x`` are one family ``x``)."""
    names = []
    for column in columns:
        if column in STEP_COLUMNS:
            continue
        base = column[4:] if column.startswith("val_") else column
        if base not in names:
            names.append(base)
    return sorted(names, key=lambda name: (name != "loss", name))


def plot_training_curves(logs, path, dpi=100):
    """Training curves from Keras CSV logs (``keras.callbacks.CSVLogger``; the presets ship
    ``zoo/presets/<name>/train_log.csv``): ``logs`` is a path, a list of paths (named by their folders) or a dict
    ``{name: path or table}``, a table being columns in memory with an ``epoch`` or ``episode`` column (a few-shot
    card's ``meta_training``: its episodic loss, query accuracy and EMD signals). One ``2 * PANEL_INCHES`` panel per
    metric (the union over the logs), one row; training solid, validation dashed, one colour per log; the legend
    gives each validation curve's best value and step. The logs must count the same steps (epochs or episodes).
    """
    check_output(path, dpi)
    if logs is None:
        raise ValueError("`logs` must name at least one CSV log, or give a table.")
    items = _log_items(logs)
    if not items:
        raise ValueError("`logs` must name at least one CSV log.")
    tables = [(name, _log_table(source)) for name, source in items]
    step, steps = _steps(tables)
    families = []
    for _, table in tables:
        for family in curve_families(table):
            if family not in families:
                families.append(family)
    families = sorted(families, key=lambda name: (name != "loss", name))
    if not families:
        raise ValueError("`logs`: the logs hold no metric columns besides 'epoch'.")
    figure = _figure(len(families), 1, 2 * PANEL_INCHES, margin=0.35)
    axes = figure.subplots(1, len(families), squeeze=False)[0]
    colors = [f"C{i}" for i in range(10)]
    for ax, family in zip(axes, families):
        lower_is_better = "loss" in family or "error" in family
        for i, ((name, table), epochs) in enumerate(zip(tables, steps)):
            color = colors[i % len(colors)]
            if family in table:
                ax.plot(epochs, table[family], color=color, linewidth=1.2, label=f"{name} train")
            values = table.get(f"val_{family}")
            if values is not None and np.any(np.isfinite(values)):  # a log without validation holds NA there
                best = int(np.nanargmin(values) if lower_is_better else np.nanargmax(values))
                ax.plot(epochs, values, color=color, linewidth=1.2, linestyle="--",
                        label=f"{name} val (best {values[best]:.4f}, {step} {int(epochs[best])})")
        ax.set_title(family, fontsize=FONT_SIZE + 1)
        ax.set_xlabel(step, fontsize=FONT_SIZE)
        ax.tick_params(labelsize=FONT_SIZE)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=FONT_SIZE - 2)
    title = "Training curves: " + ", ".join(name for name, _ in tables)
    return _save(figure, path, dpi, title)
