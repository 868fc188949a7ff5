"""GPipe pipeline parallelism for tf_keras: micro-batches flow through K stages on K devices.

partition.py splits layers into stages, schedule.py orders the micro-steps (GPipe or 1F1B),
pipeline_model.py runs that order as one tf.function inside `model.fit`.
"""
