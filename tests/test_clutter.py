"""training.data.clutter: each image at its recorded offset of a larger canvas, pieces of clutter cut from other
images only, the draws fixed by the seed, and one clear line for bad arguments."""
import numpy as np
import pytest

from training.data.clutter import clutter


def _constant_images(count, size=6):
    """Image ``i`` is the constant ``i + 1`` (so every pixel says which image it came from)."""
    return np.broadcast_to(np.arange(1, count + 1, dtype=np.float32)[:, None, None, None],
                           (count, size, size, 1)).copy()


def test_without_clutter_each_image_sits_at_its_offset_on_a_blank_canvas():
    images = np.random.default_rng(0).uniform(0.1, 1.0, size=(50, 5, 4, 2)).astype(np.float32)
    result = clutter(images, 9, pieces=0, seed=3)
    assert result.images.shape == (50, 9, 9, 2) and result.images.dtype == np.float32
    assert result.object_size == (5, 4)
    for image, canvas, (row, column) in zip(images, result.images, result.offsets):
        np.testing.assert_array_equal(canvas[row:row + 5, column:column + 4], image)
        canvas = canvas.copy()
        canvas[row:row + 5, column:column + 4] = 0
        assert not canvas.any()


def test_offsets_cover_every_position_of_the_canvas():
    result = clutter(np.ones((600, 4, 4, 1), np.float32), 6, pieces=0, seed=0)
    rows, columns = result.offsets.T
    assert set(rows) == {0, 1, 2} and set(columns) == {0, 1, 2}


def test_pieces_come_from_other_images_and_never_erase_the_object():
    count, pieces, piece_size = 40, 3, 2
    images = _constant_images(count)
    result = clutter(images, 14, pieces=pieces, piece_size=piece_size, seed=1)
    for index, (canvas, (row, column)) in enumerate(zip(result.images[..., 0], result.offsets)):
        own = index + 1
        object_region = canvas[row:row + 6, column:column + 6]
        assert np.all(object_region >= own)  # the maximum keeps the object's ink
        outside = canvas.copy()
        outside[row:row + 6, column:column + 6] = 0
        values = set(np.unique(outside)) - {0.0}
        assert own not in values and len(values) <= pieces
        # pieces lie over the object too: at most pieces x piece_size^2 pixels differ from the plain canvas
        assert np.count_nonzero(outside) + np.count_nonzero(object_region != own) <= pieces * piece_size ** 2
    assert np.count_nonzero(result.images != clutter(images, 14, pieces=0, seed=1).images) > 0


def test_pieces_are_crops_of_the_source_images():
    # one image is a ramp, the other zero: a piece cut from the ramp is a contiguous block of the ramp
    ramp = np.arange(1, 65, dtype=np.float32).reshape(8, 8)
    images = np.stack([np.zeros((8, 8), np.float32), ramp])[..., None]
    result = clutter(images, 20, pieces=1, piece_size=3, seed=5)
    canvas = result.images[0, ..., 0]
    rows, columns = np.nonzero(canvas)
    block = canvas[rows.min():rows.max() + 1, columns.min():columns.max() + 1]
    assert block.shape == (3, 3)
    top, left = divmod(int(block[0, 0]) - 1, 8)
    np.testing.assert_array_equal(block, ramp[top:top + 3, left:left + 3])


def test_the_seed_fixes_every_draw():
    images = np.random.default_rng(1).uniform(size=(30, 8, 8, 1)).astype(np.float32)
    first, again = clutter(images, 12, seed=7), clutter(images, 12, seed=7)
    np.testing.assert_array_equal(first.images, again.images)
    np.testing.assert_array_equal(first.offsets, again.offsets)
    assert not np.array_equal(first.images, clutter(images, 12, seed=8).images)


def test_the_clutter_does_not_move_the_objects():
    """The offsets are drawn before the clutter, so canvases with and without clutter from the same seed hold each
    object at the same place: a run on translated canvases pairs with one on cluttered canvases."""
    images = np.random.default_rng(2).uniform(0.1, 1.0, size=(40, 8, 8, 1)).astype(np.float32)
    plain, cluttered = clutter(images, 16, pieces=0, seed=5), clutter(images, 16, pieces=3, seed=5)
    np.testing.assert_array_equal(plain.offsets, cluttered.offsets)
    assert np.all(cluttered.images >= plain.images) and np.any(cluttered.images > plain.images)


@pytest.mark.parametrize("kwargs, message", [
    (dict(images=np.ones((3, 8, 8), np.float32), canvas_size=10), "`images` must be a batch of images"),
    (dict(images=np.ones((3, 8, 8, 1)), canvas_size=7), "`canvas_size` must be at least the images' size 8"),
    (dict(images=np.ones((3, 8, 8, 1)), canvas_size=0), "`canvas_size`"),
    (dict(images=np.ones((3, 8, 8, 1)), canvas_size=10, pieces=-1), "`pieces`"),
    (dict(images=np.ones((3, 8, 8, 1)), canvas_size=10, piece_size=9), "`piece_size` must be at most"),
    (dict(images=np.ones((1, 8, 8, 1)), canvas_size=10, pieces=2), "at least 2 images"),
    (dict(images=np.full((2, 8, 8, 1), np.nan), canvas_size=10), "`images` holds NaN"),
    (dict(images=np.ones((2, 8, 8, 1)), canvas_size=10, seed=-1), "`seed`"),
])
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        clutter(**kwargs)


def test_one_image_without_clutter_is_allowed():
    result = clutter(np.ones((1, 4, 4, 1), np.float32), 5, pieces=0)
    assert result.images.shape == (1, 5, 5, 1) and result.images.sum() == 16
