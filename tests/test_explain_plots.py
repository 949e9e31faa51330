"""explain.plots: every plot runs on a small untrained model and writes a non-empty PNG of the size its layout
(cols x rows panels, documented in each docstring) gives; explain_model writes the kinds that fit a model."""
import os

import numpy as np
import pytest
from PIL import Image

import explain
import zoo
from explain.plots import HEADER_INCHES, PANEL_INCHES

SMALL = dict(width=8, feature_dim=16)
DPI = 50


def _images(count, seed=0, shape=(28, 28, 1)):
    return np.random.default_rng(seed).integers(0, 256, (count,) + shape).astype(np.uint8)


def _check_png(path, cols, rows, panel=PANEL_INCHES):
    assert os.path.isfile(path) and os.path.getsize(path) > 0
    with Image.open(path) as image:
        assert image.format == "PNG"
        size = image.size
        pixels = np.asarray(image.convert("L"), dtype=np.float64)
    assert size == (round(cols * panel * DPI), round((rows * panel + HEADER_INCHES) * DPI))
    assert pixels.std() > 5  # something was drawn


@pytest.fixture(scope="module")
def mpw_model():
    return zoo.image_classifier("small_convnet", "mpw", 4, input_shape=(28, 28, 1), backbone_kwargs=SMALL,
                                head_kwargs=dict(num_proxies=3))


def test_plot_mpw_plans(mpw_model, tmp_path):
    path = explain.plot_mpw_plans(mpw_model, _images(1)[0], str(tmp_path / "mpw.png"), label=2, dpi=DPI,
                                  class_names=["a", "b", "c", "d"])
    _check_png(path, 2 + 3, 2)


def test_plot_mpw_plans_fits_another_input_size(mpw_model, tmp_path):
    # An RGB 40x40 image is converted to the model's 28x28 grayscale input.
    path = explain.plot_mpw_plans(mpw_model, _images(1, shape=(40, 40, 3))[0], str(tmp_path / "rgb.png"), dpi=DPI)
    _check_png(path, 5, 2)
    with pytest.raises(ValueError, match="`image`"):
        explain.plot_mpw_plans(mpw_model, _images(2), str(tmp_path / "two.png"))


def test_plot_gsp_weights(tmp_path):
    model = zoo.embedding_model("small_convnet", "gsp", 8, input_shape=(28, 28, 1), backbone_kwargs=SMALL,
                                pooling_kwargs=dict(num_prototypes=4))
    path = explain.plot_gsp_weights(model, _images(3), str(tmp_path / "gsp.png"), labels=[0, 1, 2], dpi=DPI)
    _check_png(path, 3, 2)


def test_gsp_weights_of_an_image_file_beside_a_test_image(tmp_path):
    """``otzoo explain GSP_PRESET photo.png --test-index 0``: the file's label is unknown (None) beside the test
    image's; plot_gsp_weights refused the None (a traceback) instead of titling that image by its position."""
    model = zoo.embedding_model("small_convnet", "gsp", 8, input_shape=(28, 28, 1), backbone_kwargs=SMALL,
                                pooling_kwargs=dict(num_prototypes=4))
    path = explain.plot_gsp_weights(model, _images(2), str(tmp_path / "gsp.png"), labels=[None, 1], dpi=DPI)
    _check_png(path, 2, 2)
    written = explain.explain_model(model, str(tmp_path / "out"), images=_images(2), labels=[None, 3],
                                    kinds=["gsp"], dpi=DPI)
    _check_png(written["gsp"][0], 2, 2)
    with pytest.raises(ValueError, match="`labels` must be an integer class label, got 1.5"):
        explain.plot_gsp_weights(model, _images(2), str(tmp_path / "bad.png"), labels=[None, 1.5], dpi=DPI)


def test_plot_emd_flows(tmp_path):
    model = zoo.few_shot_model("small_convnet", "emd", ways=3, input_shape=(28, 28, 1), backbone_kwargs=SMALL)
    support, labels = _images(6, seed=1), np.array([0, 1, 2, 0, 1, 2])  # 2 shots: flows to the class means
    path = explain.plot_emd_flows(model, _images(1)[0], support, labels, str(tmp_path / "emd.png"), class_index=1,
                                  query_label=1, dpi=DPI)
    _check_png(path, 3, 2)
    with pytest.raises(ValueError, match="`class_index`"):
        explain.plot_emd_flows(model, _images(1)[0], support, labels, str(tmp_path / "x.png"), class_index=3)


def test_plot_prototypes_with_and_without_history(tmp_path):
    model = zoo.image_classifier("small_convnet", "hyperspherical", 5, input_shape=(28, 28, 1),
                                 backbone_kwargs=SMALL)
    path = explain.plot_prototypes(model, str(tmp_path / "p1.png"), dpi=DPI)
    _check_png(path, 1, 1, 2 * PANEL_INCHES)  # no representatives yet, no history: one panel
    layer = model.get_layer("hyperspherical_head")
    layer.representatives.assign(np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32))
    history = [np.arange(5), np.array([1, 0, 2, 3, 4])]
    path = explain.plot_prototypes(model, str(tmp_path / "p3.png"), history=history, dpi=DPI)
    _check_png(path, 3, 1, 2 * PANEL_INCHES)
    path = explain.plot_prototypes(layer, str(tmp_path / "p_counts.png"), history=[2, 0, 1], dpi=DPI)
    _check_png(path, 3, 1, 2 * PANEL_INCHES)


def test_plot_retrieval(mpw_model, tmp_path):
    gallery = _images(10, seed=3)
    labels = np.arange(10) % 3
    path = explain.plot_retrieval(mpw_model, gallery[:2], gallery, str(tmp_path / "r.png"), query_labels=labels[:2],
                                  gallery_labels=labels, k=4, exclude=[0, 1], dpi=DPI)
    _check_png(path, 1 + 4, 2)
    path = explain.plot_retrieval(mpw_model, gallery[:1], gallery, str(tmp_path / "r2.png"), k=2, dpi=DPI)
    _check_png(path, 1 + 2, 1)


def test_retrieval_frames_a_labelled_query_by_class_beside_one_of_unknown_class(mpw_model, tmp_path, monkeypatch):
    """otzoo explain with a test image and an image file: every frame was grey, the test image's too."""
    from explain import plots

    colors = []
    original = plots._frame
    monkeypatch.setattr(plots, "_frame", lambda ax, color, *args: (colors.append(color), original(ax, color, *args)))
    gallery, labels = _images(10, seed=3), np.arange(10) % 3
    explain.plot_retrieval(mpw_model, gallery[:2], gallery, str(tmp_path / "r.png"), query_labels=[1, None],
                           gallery_labels=labels, k=3, dpi=DPI)
    frames = [c for c in colors if c != "black"]  # the queries' own frames are black
    assert len(frames) == 6
    assert set(frames[:3]) <= {plots.RIGHT, plots.WRONG} and frames[3:] == [plots.UNKNOWN] * 3


def test_plot_training_curves(tmp_path):
    log = tmp_path / "run" / "log.csv"
    log.parent.mkdir()
    log.write_text("epoch,accuracy,loss,val_accuracy,val_loss,learning_rate\n0,0.5,1.0,0.6,0.9,0.1\n"
                   "1,0.7,0.6,0.65,0.7,0.05\n2,0.8,0.4,0.7,0.6,0.01\n")
    path = explain.plot_training_curves(str(log), str(tmp_path / "c.png"), dpi=DPI)
    _check_png(path, 3, 1, 2 * PANEL_INCHES)  # loss, accuracy, learning_rate
    with pytest.raises(FileNotFoundError, match="`logs`"):
        explain.plot_training_curves(str(tmp_path / "none.csv"), str(tmp_path / "x.png"))


def test_training_curves_of_a_run_without_validation(tmp_path):
    """A run trained on the whole training split (the presets' final runs) logged ``NA`` in Keras' ``val_`` columns
    (the shipped train_log.csv files): the training curves are drawn, the validation ones left out."""
    log = tmp_path / "train_log.csv"
    log.write_text("epoch,loss,val_loss\n0,1.6,NA\n1,0.9,NA\n2,0.7,NA\n")
    path = explain.plot_training_curves(str(log), str(tmp_path / "c.png"), dpi=DPI)
    _check_png(path, 1, 1, 2 * PANEL_INCHES)


def test_meta_training_curves_by_episode(tmp_path):
    """A few-shot card's meta-training history (columns in memory, counted in episodes) draws one panel per
    metric; a log counted in epochs cannot share its figure, and a table without a step column is refused."""
    history = {"episode": [50, 100, 150], "loss": [0.9, 0.6, 0.5], "accuracy": [0.6, 0.7, 0.75],
               "emd_head_marginal_error": [1e-3, 2e-3, 1e-3]}
    path = explain.plot_training_curves({"meta-training": history}, str(tmp_path / "m.png"), dpi=DPI)
    _check_png(path, 3, 1, 2 * PANEL_INCHES)  # loss, accuracy, emd_head_marginal_error
    log = tmp_path / "log.csv"
    log.write_text("epoch,loss\n0,1.0\n1,0.8\n")
    with pytest.raises(ValueError, match="`logs`: the logs count different steps \\(episode, epoch\\)"):
        explain.plot_training_curves({"pre-training": str(log), "meta-training": history}, str(tmp_path / "x.png"))
    with pytest.raises(ValueError, match="`logs`: a table needs one of the columns"):
        explain.plot_training_curves({"t": {"loss": [1.0]}}, str(tmp_path / "y.png"))


def test_explain_model_writes_the_kinds_that_fit(mpw_model, tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("epoch,loss\n0,1.0\n1,0.5\n")
    assert explain.available_kinds(mpw_model, logs=str(log)) == ["mpw", "retrieval", "curves"]
    images = _images(2)
    written = explain.explain_model(mpw_model, str(tmp_path / "out"), images=images, labels=[0, 1],
                                    names=["a", "b"], gallery=_images(6, seed=5), gallery_labels=np.arange(6) % 4,
                                    logs=str(log), k=3, dpi=DPI)
    assert sorted(written) == ["curves", "mpw", "retrieval"]
    assert [os.path.basename(p) for p in written["mpw"]] == ["mpw_a.png", "mpw_b.png"]
    for paths in written.values():
        for path in paths:
            assert os.path.getsize(path) > 0
    with pytest.raises(ValueError, match="`kinds`: 'gsp' does not fit"):
        explain.explain_model(mpw_model, str(tmp_path / "out"), images=images, kinds=["gsp"])


def _drawn_figures(monkeypatch):
    """The figures the plots save, kept (``explain.plots._save`` wrapped) to be measured after drawing."""
    from explain import plots
    figures, save = [], plots._save

    def keep(figure, path, dpi, title):
        figures.append(figure)
        return save(figure, path, dpi, title)

    monkeypatch.setattr(plots, "_save", keep)
    return figures


def _pixels(figure):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return canvas.get_renderer()


def test_the_title_of_a_narrow_figure_stays_inside_it(tmp_path, monkeypatch):
    """A GSP picture of one image (``otzoo explain`` of a GSP preset draws one by default) is one panel wide: its
    title ran off both sides of the figure; now it is wrapped (and made smaller where needed) inside the figure,
    above the panels' own titles."""
    figures = _drawn_figures(monkeypatch)
    model = zoo.embedding_model("small_convnet", "gsp", 8, input_shape=(28, 28, 1), backbone_kwargs=SMALL,
                                pooling_kwargs=dict(num_prototypes=4))
    explain.plot_gsp_weights(model, _images(1), str(tmp_path / "gsp.png"), labels=[1], dpi=DPI)
    explain.plot_gsp_weights(model, _images(2), str(tmp_path / "gsp2.png"), dpi=DPI)
    for figure in figures:
        renderer = _pixels(figure)
        title = figure._suptitle.get_window_extent(renderer)
        width = figure.get_figwidth() * figure.dpi
        assert 0 <= title.x0 and title.x1 <= width, (title, width)
        assert title.y0 >= max(ax.title.get_window_extent(renderer).y1 for ax in figure.axes if ax.get_title())
    assert figures[0]._suptitle.get_text().startswith("GSP pooling weights x n")


def test_assignment_changes_are_counted_from_zero_in_whole_numbers(tmp_path, monkeypatch):
    """The bar chart of the classes that changed prototype per epoch: all-zero counts (the presets' logs) drew a
    count axis from -0.04 to 0.04 with fractional ticks."""
    figures = _drawn_figures(monkeypatch)
    model = zoo.image_classifier("small_convnet", "hyperspherical", 5, input_shape=(28, 28, 1),
                                 backbone_kwargs=SMALL)
    for counts in ([0, 0, 0], [0, 3, 1]):
        explain.plot_prototypes(model, str(tmp_path / "p.png"), history=counts, dpi=DPI)
    for figure, top in zip(figures, (1, 3)):
        _pixels(figure)
        bars = figure.axes[-1]
        assert bars.get_ylim()[0] == 0 and bars.get_ylim()[1] >= top
        ticks = [t for t in bars.get_yticks() if bars.get_ylim()[0] <= t <= bars.get_ylim()[1]]
        assert ticks and all(float(t).is_integer() and t >= 0 for t in ticks), ticks


def test_epochs_without_a_prototype_change_count_get_no_bar(tmp_path, monkeypatch):
    """A log whose ``prototype_changes`` column has empty or NA cells (epochs the callback did not run at): the NaN
    became -9223372036854775808 (``astype(int)``) and drew a meaningless bar. Now such an epoch has no bar, the
    others keep theirs at their own epoch, and the panel's title counts the epochs left out."""
    figures = _drawn_figures(monkeypatch)
    model = zoo.image_classifier("small_convnet", "hyperspherical", 5, input_shape=(28, 28, 1),
                                 backbone_kwargs=SMALL)
    log = tmp_path / "log.csv"
    log.write_text("epoch,loss,prototype_changes\n0,1.0,3\n1,0.9,\n2,0.8,NA\n3,0.7,1\n")
    for history in (str(log), [3, None, float("nan"), 1]):
        path = explain.plot_prototypes(model, str(tmp_path / "p.png"), history=history, dpi=DPI)
        _check_png(path, 2, 1, 2 * PANEL_INCHES)
    for figure in figures:
        _pixels(figure)
        bars = figure.axes[-1]
        drawn = sorted((patch.get_x() + patch.get_width() / 2, patch.get_height()) for patch in bars.patches)
        assert drawn == [(1, 3), (4, 1)], drawn
        assert bars.get_ylim() == (0, pytest.approx(3 * 1.05)) and bars.get_xlim()[1] > 4
        assert "2 epoch(s) without a count" in bars.get_title()
