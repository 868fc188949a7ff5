"""A run whose loss becomes NaN or infinite stops with TrainingDiverged and publishes no model."""
import os

import pytest

from hpml.components.errors import TrainingDiverged
from hpml.components.trainer import TRAINER
from hpml.components.trainer.launchers.local import LaunchError
from tests.helpers import trainer_inputs, trainer_outputs

DIVERGING = os.path.join(os.path.dirname(__file__), "assets", "diverging_run_fn.py")


def _attempts(outputs) -> int:
    with open(outputs["model"] + ".work/attempts", encoding="utf-8") as handle:
        return handle.read().count("attempt")


def test_a_diverging_run_stops_at_the_step_the_loss_overflows(penguin_outputs, tmp_path):
    outputs = trainer_outputs(tmp_path, "diverged")
    params = {"module": DIVERGING, "strategy": "one_device", "hyperparameters": {"learning_rate": 3.0}}
    with pytest.raises(TrainingDiverged, match=r"training diverged: loss is (inf|nan) after step [1-8] of epoch "
                                               r"3/4 \(epoch 2/4 ended at loss 1\.\d+e\+24\)") as err:
        TRAINER.run(trainer_inputs(penguin_outputs), outputs, params)
    assert "lower the learning rate" in err.value.hint
    finished = err.value.partial_history  # for the run record: the epochs before the divergence
    assert [row["epoch"] for row in finished] == [1, 2] and 1e24 < finished[1]["loss"] < 1e25
    assert not os.path.exists(outputs["model"]), "a diverged model must not be published"
    # The same module at a sound rate trains and publishes: the check does not fire on a finite loss.
    sound = trainer_outputs(tmp_path, "sound")
    TRAINER.run(trainer_inputs(penguin_outputs), sound, dict(params, hyperparameters={"learning_rate": 0.05}))
    assert os.path.isfile(os.path.join(sound["model"], "Format-Serving", "saved_model.pb"))


def test_an_overflowing_validation_loss_names_the_eval_split(penguin_outputs, tmp_path):
    outputs = trainer_outputs(tmp_path, "val_diverged")
    params = {"module": DIVERGING, "strategy": "one_device",
              "hyperparameters": {"learning_rate": 0.05, "eval_scale": 1e38}}
    with pytest.raises(TrainingDiverged, match=r"training diverged: val_loss is (inf|nan) at the end of epoch 1/4$") \
            as err:
        TRAINER.run(trainer_inputs(penguin_outputs), outputs, params)
    assert "eval split" in err.value.hint
    assert not os.path.exists(outputs["model"])


def test_a_diverging_cluster_is_not_restarted(penguin_outputs, tmp_path):
    """Two MWMS workers: the chief's check fails the job once, and the launcher spends no restart on it."""
    outputs = trainer_outputs(tmp_path, "cluster_diverged")
    with pytest.raises(LaunchError, match=r"not restarted: worker-0 exited with code 2: hpml\.components\.errors\."
                                          r"TrainingDiverged: training diverged: loss is (inf|nan) after step") as err:
        TRAINER.run(trainer_inputs(penguin_outputs), outputs, {
            "module": DIVERGING, "num_workers": 2, "max_restarts": 2, "hyperparameters": {"learning_rate": 3.0}})
    assert _attempts(outputs) == 1, "the job was restarted for a divergence no restart mends"
    assert [row["epoch"] for row in err.value.partial_history] == [1, 2], "the chief's finished epochs"
    assert not os.path.exists(outputs["model"])
