"""Names made unique: the one rule for served inputs, ONNX dimensions and the parts of an ensemble."""


def unique_names(names):
    """``names`` with each repeat made unique by the first free suffix ``_1``, ``_2``, ...: free among the names
    given so far and those still to come, so a repeat never takes another's name (``x``, ``x``, ``x_1`` give ``x``,
    ``x_2``, ``x_1``). Used for served input names (TensorFlow renamed a clash itself, and the signature then had a
    name no one knew), ONNX batch dimensions and the learners of an EDMS ensemble."""
    names, result = list(names), []
    for i, name in enumerate(names):
        unique, count = name, 0
        while unique in result or (unique != name and unique in names[i + 1:]):
            count += 1
            unique = f"{name}_{count}"
        result.append(unique)
    return tuple(result)
