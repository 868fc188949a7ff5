"""The Trainer's eval after fit: the final epoch's validation stands for model.evaluate, and the confusion matrix
comes from one compiled pass; both must equal the plain computations they replace."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from hpml.components.trainer.classification import classification_report, confusion_matrix
from hpml.components.trainer.evaluation import final_eval_metrics, validated_in_fit

CLASSES = 3


def _data(n=203, batch=16, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (np.argmax(x[:, :CLASSES], axis=1)).reshape(-1, 1).astype("int64")
    return x, y, tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(batch)


def _model(steps_per_execution=1):
    tf_keras.utils.set_random_seed(1)
    inputs = tf_keras.Input(shape=(4,), name="x")
    outputs = tf_keras.layers.Dense(CLASSES, activation="softmax")(tf_keras.layers.Dense(8, "relu")(inputs))
    model = tf_keras.Model({"x": inputs}, outputs)
    model.compile(optimizer=tf_keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], steps_per_execution=steps_per_execution)
    return model


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_the_final_epochs_validation_is_what_evaluate_gives(steps_per_execution):
    _, _, data = _data()
    model = _model(steps_per_execution)
    history = model.fit(data, epochs=3, validation_data=data, validation_steps=13, verbose=0)
    taken = validated_in_fit(model, history)
    evaluated = model.evaluate(data, steps=13, verbose=0, return_dict=True)
    assert set(taken) == {"loss", "accuracy"}
    for name, value in evaluated.items():
        assert taken[name] == pytest.approx(value, rel=1e-6), name
    assert final_eval_metrics(model, data, 13, history) == taken


def test_evaluate_runs_where_fit_validated_nothing_final():
    _, _, data = _data()
    model = _model()
    without_validation = model.fit(data, epochs=2, verbose=0)
    assert validated_in_fit(model, without_validation) is None
    # every epoch already done (as in a run resumed from a backup taken after its last epoch): fit runs none
    nothing_run = model.fit(data, epochs=2, initial_epoch=2, validation_data=data, verbose=0)
    assert validated_in_fit(model, nothing_run) is None
    # validation every other epoch: the final epoch's is missing
    skipped = model.fit(data, epochs=3, validation_data=data, validation_freq=2, verbose=0)
    assert validated_in_fit(model, skipped) is None
    evaluated = model.evaluate(data, verbose=0, return_dict=True)
    for history in (None, without_validation, nothing_run, skipped):
        assert final_eval_metrics(model, data, None, history) == pytest.approx(evaluated, rel=1e-6)


@pytest.mark.parametrize("steps", [None, 5])
def test_compiled_confusion_matrix_equals_counting_predictions(steps):
    x, y, data = _data()
    model = _model()
    model.fit(data, epochs=2, verbose=0)
    rows = len(x) if steps is None else 16 * steps
    predicted = np.argmax(model.predict(x[:rows], verbose=0), axis=1)
    expected = np.zeros((CLASSES, CLASSES), dtype=np.int64)
    np.add.at(expected, (y[:rows, 0], predicted), 1)
    assert expected.sum() == rows and np.count_nonzero(expected - np.diag(np.diag(expected))) > 0
    np.testing.assert_array_equal(confusion_matrix(model, data, CLASSES, steps), expected)
    report = classification_report(model, data, ["a", "b", "c"], steps)
    assert report["examples"] == rows and report["confusion_matrix"] == expected.tolist()
    correct = np.trace(expected)
    assert sum(row["recall"] * row["support"] for row in report["per_class"]) == pytest.approx(correct)


def _counted_in_fit(model, data, epochs=3, **fit):
    from hpml.components.trainer.callbacks import ValidationConfusion

    counted = ValidationConfusion(CLASSES)
    model.fit(data, epochs=epochs, validation_data=data, validation_steps=fit.pop("validation_steps", 13),
              callbacks=[counted], verbose=0, **fit)
    return counted


@pytest.mark.parametrize("replicas,steps_per_execution", [(1, 1), (1, 4), (2, 1), (2, 4)])
def test_the_confusion_counted_in_fits_final_validation_is_the_pass_after_fit(replicas, steps_per_execution):
    """Counted inside fit's own validation steps (one device, or summed over two replicas), the matrix equals a
    pass over the same steps after fit; the report made from it equals the one a second pass makes."""
    _, _, data = _data()
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{n}" for n in range(replicas)]) if replicas > 1 \
        else tf.distribute.get_strategy()
    with strategy.scope():
        model = _model(steps_per_execution)
    counted = _counted_in_fit(model, data)
    expected = confusion_matrix(model, data, CLASSES, 13)
    assert expected.sum() == 203 and np.count_nonzero(expected - np.diag(np.diag(expected))) > 0
    assert counted.matrix is not None and counted.matrix.dtype == np.int64
    np.testing.assert_array_equal(counted.matrix, expected)
    assert classification_report(model, data, ["a", "b", "c"], 13, counted.matrix) == \
        classification_report(model, data, ["a", "b", "c"], 13)
    # fit's metrics are the ones they were without the counting
    twin = _model(steps_per_execution) if replicas == 1 else None
    if twin is not None:
        plain = twin.fit(data, epochs=3, validation_data=data, validation_steps=13, verbose=0)
        np.testing.assert_allclose(model.history.history["val_loss"], plain.history["val_loss"], rtol=1e-6)


def test_no_matrix_where_fits_last_epoch_did_not_validate_or_the_model_has_its_own_test_step(tmp_path):
    """Then write_classification_report makes its own pass, and its report is the same."""
    import json

    from hpml.components.trainer.classification import write_classification_report

    _, _, data = _data()
    model = _model()
    assert _counted_in_fit(model, data, validation_freq=2).matrix is None  # epochs 2 of 3 validated
    assert _counted_in_fit(model, data, initial_epoch=3).matrix is None  # nothing left to run

    class OwnTestStep(tf_keras.Model):
        def test_step(self, data):
            return super().test_step(data)

    inputs = tf_keras.Input(shape=(4,), name="x")
    own = OwnTestStep({"x": inputs}, tf_keras.layers.Dense(CLASSES, activation="softmax")(inputs))
    own.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    counted = _counted_in_fit(own, data, epochs=1)
    assert counted.matrix is None and "test_step" not in vars(own)
    report = write_classification_report(str(tmp_path), own, data, ["a", "b", "c"], 13, counted)
    assert report == json.loads((tmp_path / "classification.json").read_text())
    assert report["confusion_matrix"] == confusion_matrix(own, data, CLASSES, 13).tolist()


def test_a_callback_used_for_a_second_models_fit_counts_that_model():
    """A ValidationConfusion handed to fit again, with another model (one with a test_step of its own, then a plain
    one), reports that fit's model or nothing: never the first model's counts, never zeros."""
    from hpml.components.trainer.callbacks import ValidationConfusion

    _, _, data = _data()
    counted = ValidationConfusion(CLASSES)
    _model().fit(data, epochs=1, validation_data=data, validation_steps=13, callbacks=[counted], verbose=0)
    assert counted.matrix is not None

    class OwnTestStep(tf_keras.Model):
        def test_step(self, data):
            return super().test_step(data)

    inputs = tf_keras.Input(shape=(4,), name="x")
    own = OwnTestStep({"x": inputs}, tf_keras.layers.Dense(CLASSES, activation="softmax")(inputs))
    own.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    own.fit(data, epochs=1, validation_data=data, validation_steps=13, callbacks=[counted], verbose=0)
    assert counted.matrix is None
    second = _model()
    second.layers[-1].set_weights([w * -1 for w in second.layers[-1].get_weights()])  # predicts otherwise
    second.fit(data, epochs=1, validation_data=data, validation_steps=13, callbacks=[counted], verbose=0)
    np.testing.assert_array_equal(counted.matrix, confusion_matrix(second, data, CLASSES, 13))
