"""Checks of a model's image input shape."""
import numbers


def check_input_shape(input_shape, name="input_shape"):
    """``input_shape`` must be ``(H, W, C)``: ``H``, ``W`` positive integers or ``None``, ``C`` a positive
    integer. Returns it as a tuple."""
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = None
    ok = shape is not None and len(shape) == 3 and all(
        d is None or (isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 1) for d in shape)
    if not ok or shape[2] is None:
        raise ValueError(f"`{name}` must be (height, width, channels) with positive sizes (height and width may be "
                         f"None, channels may not), got {input_shape!r}.")
    return tuple(None if d is None else int(d) for d in shape)
