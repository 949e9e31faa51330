"""How selective GSP's pooling is at each epsilon of the ``gsp_epsilon_choice.py`` grid: one seed retrained to each
epsilon's budget, and its pooling weights on the test images.

GSP pools a feature map with weights ``p_j`` (the transported mass of each position over the transport ratio, Gurbuz
2022 Eq. 5.2.1; they sum to one). As epsilon grows they tend to the uniform ``1/n``, that is to global average
pooling. Two numbers say how far a model is from that limit, averaged over the test images:

- the effective share of positions ``1 / (n sum_j p_j^2)``: 1 for uniform weights, ``k / n`` for weights spread
  evenly over ``k`` of the ``n`` positions;
- the mass on the top quarter of the positions (the largest ``ceil(n / 4)`` weights): 0.25 for uniform weights.

On cluttered canvases (a comparison run with ``gsp_vs_gap.py --canvas``) a third number says whether the selection
finds the garment: the mass on the garment's box, each position's weight times the share of its cell (the block of
pixels its stride covers) inside the box where the garment was placed. Uniform weights put the box's share of the
canvas there (784/1600 = 0.49 for 28x28 garments on 40x40 canvases).

Each epsilon's run is ``gsp_vs_gap.train_model`` with the comparison's configuration, stopped at that epsilon's
budget (moving BatchNorm statistics); its test MAP@R at the end is written beside the one the comparison recorded for
the same seed and epoch, a check that the retrained model is the compared one (up to the CPU's round-off in
training). A later call with the same ``--choice``, ``--seed`` and ``--out`` keeps the rows it finds there and
trains only the epsilons (or budgets) that are new. The recorded measurements (docs/results/gsp.md), on the plain
images, on cluttered canvases and on the same canvases without clutter:

    python experiments/gsp_selectivity.py --choice experiments/results/gsp_vs_gap_epsilon_choice.json --seed 0 --out experiments/results/gsp_selectivity.json
    python experiments/gsp_selectivity.py --choice experiments/results/gsp_vs_gap_clutter_epsilon_choice.json --seed 0 --out experiments/results/gsp_selectivity_clutter.json
    python experiments/gsp_selectivity.py --choice experiments/results/gsp_vs_gap_translated_epsilon_choice.json --seed 0 --out experiments/results/gsp_selectivity_translated.json
"""
import argparse
import json
import math
import os

import numpy as np

from epoch_budget import write_json
from explain.signals import gsp_weights
from gsp_vs_gap import IMAGE_SIZE, canvas_images, cluttered_splits, is_cluttered, load_splits, train_model


def selectivity(weights):
    """Per-image effective share of positions and mass on the top quarter of positions of pooling ``weights``
    ``(B, n)`` (rows summing to one), as ``(share, top_quarter)`` arrays of length ``B``."""
    weights = np.asarray(weights, dtype=float)
    n = weights.shape[1]
    share = 1.0 / (n * np.sum(weights ** 2, axis=1))
    top = np.sort(weights, axis=1)[:, n - math.ceil(n / 4):]
    return share, top.sum(axis=1)


def pooling_weights(embedding_model, images, batch_size=500):
    """GSP's pooling weights ``(B, n)`` on ``images``: ``explain.signals.gsp_weights`` of the layer ``gsp`` of
    ``embedding_model``, ``batch_size`` images at a time, and the feature map's ``(rows, columns)``."""
    chunks = [gsp_weights(embedding_model, images[i:i + batch_size], layer_name="gsp")
              for i in range(0, len(images), batch_size)]
    return np.concatenate([chunk.weights for chunk in chunks]), chunks[0].grid


def object_overlap(offsets, object_size, canvas_size, grid):
    """``(B, rows * columns)``: the share of each feature-map cell's pixels inside its image's object box, the map's
    ``grid`` of cells tiling the ``canvas_size`` x ``canvas_size`` canvas in row-major order (each cell the block of
    pixels its position's stride covers). ``offsets`` ``(B, 2)``: the object's top-left corner; ``object_size``:
    its ``(height, width)``. Averaged with uniform weights (GAP's) it is the box's share of the canvas."""
    offsets = np.asarray(offsets)
    shares = []
    for axis, (cells, size) in enumerate(zip(grid, object_size)):
        if canvas_size % cells:
            raise ValueError(f"the feature map's {cells} cells do not tile the {canvas_size}-pixel canvas.")
        cell = canvas_size // cells
        starts = np.arange(cells) * cell
        low = np.maximum(starts[None], offsets[:, axis, None])
        high = np.minimum(starts[None] + cell, offsets[:, axis, None] + size)
        shares.append(np.clip(high - low, 0, None) / cell)
    return (shares[0][:, :, None] * shares[1][:, None, :]).reshape(len(offsets), -1)


def measured_rows(path, choice_path, seed):
    """The rows an earlier call wrote to ``path`` for the same ``--choice`` and ``--seed``, by ``(epsilon, epochs)``
    (empty when there is none), so that a grid grown by an epsilon retrains only the new one."""
    if not os.path.isfile(path):
        return {}
    with open(path) as handle:
        previous = json.load(handle)
    if previous.get("choice") != choice_path or previous.get("seed") != seed:
        return {}
    return {(row["epsilon"], row["epochs"]): row for row in previous.get("epsilons", [])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--choice", default=os.path.join(os.path.dirname(__file__), "results",
                                                         "gsp_vs_gap_epsilon_choice.json"),
                        help="the report of gsp_epsilon_choice.py: the epsilons, their budgets and the configuration")
    parser.add_argument("--seed", type=int, default=0, help="one of the compared seeds")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "gsp_selectivity.json"))
    args = parser.parse_args()
    if not os.path.isfile(args.choice):
        parser.error(f"--choice: no such file: {args.choice}")
    with open(args.choice) as handle:
        choice = json.load(handle)
    if args.seed not in choice["seeds"]:
        parser.error(f"--seed must be one of the compared seeds {choice['seeds']}, got {args.seed}.")
    config, position = choice["config"], choice["seeds"].index(args.seed)
    canvas, pieces = config.get("canvas", IMAGE_SIZE), config.get("clutter_pieces", 0)
    cluttered_test = None
    if is_cluttered(canvas, pieces):  # the test canvases' offsets are needed beside the images
        splits = cluttered_splits(config["train_per_class"], config["validation_per_class"], canvas, pieces)
        train, validation, test = canvas_images(splits)
        cluttered_test = splits[2][0]
    else:
        train, validation, test = load_splits(config["train_per_class"], config["validation_per_class"])
    kept, rows = measured_rows(args.out, args.choice, args.seed), []
    for row in choice["summary"]["moving"]["epsilons"]:
        epsilon, epochs = row["epsilon"], row["gsp"]["epochs"]
        if (epsilon, epochs) in kept:  # measured by an earlier call on the same choice and seed
            rows.append(kept[epsilon, epochs])
            print(f"kept epsilon {epsilon} ({epochs} epochs) from {args.out}", flush=True)
            continue
        run, embedding_model = train_model("gsp", args.seed, train, validation, test, epochs,
                                           config["steps_per_epoch"], epsilon, config.get("recalibrate_bn", 0))
        weights, grid = pooling_weights(embedding_model, test[0])
        share, top_quarter = selectivity(weights)
        if cluttered_test is not None:
            overlap = object_overlap(cluttered_test.offsets, cluttered_test.object_size, canvas, grid)
            garment = {"garment_box_mass_mean": float(np.mean(np.sum(weights * overlap, axis=1))),
                       "garment_box_mass_uniform": float(np.mean(overlap))}
        else:
            garment = {}
        rows.append({"epsilon": epsilon, "epochs": epochs, "positions": weights.shape[1],
                     "effective_share_mean": float(share.mean()),
                     "effective_share_quantiles_10_50_90": np.quantile(share, [0.1, 0.5, 0.9]).tolist(),
                     "top_quarter_mass_mean": float(top_quarter.mean()), **garment,
                     "test_map_at_r": run["test_map_at_r"][-1], "recorded_test_map_at_r": row["gsp"]["test"][position],
                     "seconds": run["seconds"]})
        print(json.dumps(rows[-1]), flush=True)
        write_json(args.out, {"choice": args.choice, "seed": args.seed, "epsilons": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
