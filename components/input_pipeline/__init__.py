"""The tuned tf.data input pipeline: measure the data, decide every knob, build the dataset.

Transform writes the spec as the InputPipeline artifact; the Trainer's data_accessor and any
TFX run_fn read data through `build_dataset`.
"""
from hpml.components.input_pipeline.baselines import autotune_spec, naive_spec, plain_spec
from hpml.components.input_pipeline.dataset import build_dataset
from hpml.components.input_pipeline.measure import Measurements, measure_tfrecords
from hpml.components.input_pipeline.spec import InputPipelineSpec, read_spec, schema_fingerprint, write_spec
from hpml.components.input_pipeline.tuner import tune

__all__ = [
    "InputPipelineSpec", "Measurements", "autotune_spec", "build_dataset", "measure_tfrecords", "naive_spec",
    "plain_spec", "read_spec", "schema_fingerprint", "tune", "write_spec",
]
