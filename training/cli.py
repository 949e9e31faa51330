"""The ``otzoo`` command line."""
import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def demo(args):
    """Trains a small ConvNet with the Multi-Proxy Wasserstein head on Fashion-MNIST and evaluates it."""
    import keras

    from training.classification import compile_classifier, fit_and_evaluate
    from training.data import load_fashion_mnist
    from zoo import build_classifier

    keras.utils.set_random_seed(args.seed)
    train = load_fashion_mnist("train", limit=args.limit)
    test = load_fashion_mnist("test")
    model = compile_classifier(build_classifier("mpw", num_classes=10))
    print(f"Training {model.name} (MultiProxyWasserstein head, {model.count_params():,} parameters) on "
          f"{len(train[0]):,} Fashion-MNIST images for {args.epochs} epoch(s)...")
    start = time.time()
    accuracy, history = fit_and_evaluate(model, train, test, epochs=args.epochs, seed=args.seed)
    print(f"Fashion-MNIST test accuracy: {accuracy:.4f} "
          f"(train loss {history['loss'][-1]:.4f}, {time.time() - start:.0f} s)")
    if args.save:
        model.save(args.save)
        print(f"Saved the model to {args.save}")
    return accuracy


def main(argv=None):
    parser = argparse.ArgumentParser(prog="otzoo", description="Optimal-transport and prototype layers for Keras.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo_parser = commands.add_parser("demo", help=demo.__doc__)
    demo_parser.add_argument("--epochs", type=int, default=1)
    demo_parser.add_argument("--limit", type=int, default=None, help="use the first N training images")
    demo_parser.add_argument("--seed", type=int, default=0)
    demo_parser.add_argument("--save", default=None, help="write the trained model to this .keras file")
    demo_parser.set_defaults(run=demo)
    args = parser.parse_args(argv)
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
