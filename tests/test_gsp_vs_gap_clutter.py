"""``experiments/gsp_vs_gap.py`` on cluttered canvases: the splits keep the plain splits' garments and labels, the
draws are the same in every call (runs of different seeds and poolings pair on the same images), and bad values are
one line naming the option."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import gsp_vs_gap  # noqa: E402


@pytest.mark.fashion_mnist
def test_cluttered_splits_hold_the_plain_garments_at_their_offsets():
    plain = gsp_vs_gap.load_splits(20, 10)
    cluttered = gsp_vs_gap.cluttered_splits(20, 10, 40, 4)
    again = gsp_vs_gap.load_splits(20, 10, 40, 4)
    assert [len(images) for images, _ in plain] == [100, 50, 5000]
    for (images, labels), (result, cluttered_labels), (images_again, _) in zip(plain, cluttered, again):
        np.testing.assert_array_equal(labels, cluttered_labels)
        assert result.images.shape == (len(images), 40, 40, 1)
        np.testing.assert_array_equal(images_again, result.images)  # the same draws in every call
        for image, canvas, (row, column) in zip(images[:50], result.images, result.offsets):
            assert np.all(canvas[row:row + 28, column:column + 28] >= image)  # clutter never erases the garment
        assert np.count_nonzero(result.images) > sum(np.count_nonzero(image) for image in images)
    # the three splits draw differently (their own seeds)
    assert not np.array_equal(cluttered[0][0].offsets[:50], cluttered[1][0].offsets[:50])


@pytest.mark.parametrize("option, value, message", [
    ("--canvas", "20", "--canvas must be at least Fashion-MNIST's 28 pixels, got 20."),
    ("--clutter-pieces", "-1", "argument --clutter-pieces: must be an integer >= 0, got '-1'"),
    ("--clutter-pieces", "two", "argument --clutter-pieces: must be an integer >= 0, got 'two'"),
])
def test_bad_clutter_options_are_one_line(option, value, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gsp_vs_gap.py", option, value, "--out", str(tmp_path / "runs.json")])
    with pytest.raises(SystemExit) as stop:
        gsp_vs_gap.main()
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)
