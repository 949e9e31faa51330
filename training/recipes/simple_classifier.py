"""Supervised training and evaluation of a classifier on in-memory arrays."""
import keras
import numpy as np


def compile_classifier(model, learning_rate=1e-3, jit_compile=True):
    """Adam + sparse categorical cross-entropy on logits, accuracy metric."""
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=jit_compile,
    )
    return model


def fit_and_evaluate(model, train, test, epochs=1, batch_size=64, seed=0, verbose=1, callbacks=None):
    """Fits on ``train = (x, y)`` with a seeded shuffle and returns the test accuracy and the fit history."""
    x_train, y_train = train
    order = np.random.default_rng(seed).permutation(len(x_train))
    history = model.fit(x_train[order], y_train[order], epochs=epochs, batch_size=batch_size, shuffle=True,
                        verbose=verbose, callbacks=callbacks)
    _, accuracy = model.evaluate(*test, batch_size=256, verbose=0)
    return float(accuracy), history.history
