"""PipelineModel: a tf_keras model split into K stages on K devices, trained on M micro-batches.

One train_step (one tf.function under `model.fit`) walks the schedule's micro-steps in clock
order. Each forward F(s, m) and backward B(s, m) is built explicitly under stage s's device,
with a control dependency on the stage's previous micro-step, so the graph runs the schedule
even where the dataflow alone would allow another order. Weight gradients are summed over
micro-batches (weighted by micro-batch size) and applied in a single optimizer update, so a
step equals the plain model's full-batch step.

remat: a rematerialised micro-batch runs its stage forward through `tf.recompute_grad`, which
keeps only the stage input and recomputes the forward inside the gradient, that is inside
B(s, m), where the schedule placed it. `always` does this for every micro-batch, `except_last`
for all but the last, `never` keeps every activation on the tape.
swap: the stage inputs kept for the backward wait in host memory between forward and backward.
BatchNorm: each micro-batch is normalised with its own statistics (as in GPipe); recomputation
restores a stage's non-trainable state, so moving averages move once per micro-batch.
Weight regularisers (kernel_regularizer and the like) count once per step, each stage's on its
own device; losses added in `call` (activity regularisers, add_loss) are refused.
"""
from __future__ import annotations

import collections

import tensorflow as tf
import tf_keras

from hpml.components.errors import SpecError
from hpml.components.trainer.gpipe import partition, schedule

REMAT_MODES = ("always", "except_last", "never")


def default_devices(num_stages: int) -> list[str]:
    """GPU:i when there are enough GPUs, else logical CPU devices, else CPU:0 shared."""
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if len(gpus) >= num_stages:
        return gpus[:num_stages]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    return [cpus[i % len(cpus)] for i in range(num_stages)]


def micro_step_scope(stage: int, kind: str, micro: int) -> str:
    """The graph name scope of one micro-step, e.g. stage1_B3: lets tests read the order off the graph."""
    return f"stage{stage}_{kind}{micro}"


def _sublayers(layers):
    from hpml.components.trainer import keras_internals

    return [sub for layer in layers for sub in keras_internals.sublayers(layer)]  # self included


def weight_penalties(layers) -> list:
    """The weight-regularisation terms of `layers`, computed now so that a tape records them.

    tf_keras keeps each regulariser as a callable on its (sub)layer and evaluates it whenever
    `losses` is read; here they are read per stage, so each stage differentiates its own.
    """
    return [term for sub in _sublayers(layers) for term in (fn() for fn in sub._callable_losses) if term is not None]


def refuse_call_losses(layers, stage: int):
    """Losses a layer adds in `call` depend on one micro-batch's activations and would need their own
    backward path through earlier stages; PipelineModel does not build one, so it says so."""
    for sub in _sublayers(layers):
        if sub.activity_regularizer is not None or sub._losses or sub._eager_losses:
            raise SpecError(f"layer {sub.name!r} in pipeline stage {stage} adds a loss in call "
                            "(an activity regulariser or add_loss), which PipelineModel does not support",
                            hint="use weight regularisers (kernel_regularizer, ...), or train this model "
                                 "with a data-parallel strategy")


def gate_stage_gradients(summed: list, backward_outputs: list) -> list:
    """A stage's summed weight gradients, released only once every gradient its backward passes
    computed exists, so that none of the stage's variables is updated while a backward of the
    stage has still to read it. Other stages' updates are not held back.

    A recomputed forward (remat) reads a stage's last kernel only to carry the gradient down (to
    the stage's lower layers, or to its input), so no data path leads from that read to the
    kernel's own update. tf.function orders the two with a control edge, but Grappler's dependency
    optimizer (TF 2.21) drops it. The update could then run first, and the layers below were
    differentiated through the updated kernel: on a loaded 2-core machine, one first step in about
    60 to 250. Gated, each update waits on gradients computed from every such read; test_gpipe
    checks the order in the graph as TF runs it, after Grappler.
    """
    return tf.tuple(summed, control_inputs=backward_outputs)


class PipelineModel(tf_keras.Model):
    def __init__(self, layers, num_stages: int, num_micro_batches: int, devices=None, balance="params",
                 remat: str = "except_last", schedule_name: str = "gpipe", swap: bool = False,
                 layer_costs=None, **kwargs):
        super().__init__(**kwargs)
        self.pipeline_layers = list(layers)
        if remat not in REMAT_MODES:
            raise SpecError(f"remat must be one of {', '.join(REMAT_MODES)}, got {remat!r}")
        if num_micro_batches < 1:
            raise SpecError("num_micro_batches must be >= 1")
        self.num_stages, self.num_micro_batches = num_stages, num_micro_batches
        self.remat, self.schedule_name, self.swap = remat, schedule_name, swap
        self.order = schedule.build(schedule_name, num_stages, num_micro_batches)
        self.devices = list(devices or default_devices(num_stages))
        if len(self.devices) != num_stages:
            raise SpecError(f"{num_stages} stages need {num_stages} devices, got {self.devices}")
        self.balance = balance
        self._layer_costs = layer_costs
        self.stages = None if balance in ("params", "time") else partition.counts_to_stages(
            list(balance), len(self.pipeline_layers))
        # per trace: ("F"|"B"|"R", stage) -> micro-steps built
        self.trace_counts: collections.Counter = collections.Counter()

    # -- placement ------------------------------------------------------------------------------
    def _partition(self):
        if self.stages is not None:
            return
        if self._layer_costs is not None:
            costs = list(self._layer_costs)
        elif self.balance == "params":
            costs = [max(layer.count_params(), 1) for layer in self.pipeline_layers]
        else:
            raise SpecError("balance='time' needs layer_costs (see gpipe.profile.layer_costs)")
        self.stages = partition.block_partition(costs, self.num_stages)

    def _stage_forward(self, s, x, training):
        for index in self.stages[s]:
            x = self.pipeline_layers[index](x, training=training)
        return x

    def call(self, inputs, training=False):
        if self.stages is None:
            self._check_balance_source()
            self._partition()
        x = inputs
        for s in range(self.num_stages):
            with tf.device(self.devices[s]):  # first call builds each stage's variables here
                x = self._stage_forward(s, x, training)
        return x

    def _check_balance_source(self):
        """balance='params' counts parameters, which unbuilt layers do not have yet. Layers built
        elsewhere already hold their variables on the device they were built on, so the clean
        way is to pass their costs (e.g. parameter counts) as layer_costs, or explicit counts."""
        unbuilt = not all(layer.built for layer in self.pipeline_layers)
        if self.balance == "params" and self._layer_costs is None and unbuilt:
            raise SpecError("balance='params' needs layer_costs (e.g. each layer's parameter count) for unbuilt layers",
                            hint="or give an explicit balance such as [2, 2]; pre-built layers keep the device "
                                 "they were built on")

    def stage_variables(self, s, trainable=True):
        attr = "trainable_variables" if trainable else "non_trainable_variables"
        return [v for index in self.stages[s] for v in getattr(self.pipeline_layers[index], attr)]

    def stage_layers(self, s):
        return [self.pipeline_layers[index] for index in self.stages[s]]

    # -- training -------------------------------------------------------------------------------
    def make_train_function(self, force=False):
        """Refuses, before anything is traced, what train_step cannot train (errors raised while
        tracing reach the caller wrapped by autograph)."""
        self._require_built()
        for s in range(self.num_stages):
            refuse_call_losses(self.stage_layers(s), s)
        return super().make_train_function(force)

    def _require_built(self):
        if self.stages is None:
            raise SpecError("PipelineModel must be built before training: call it once on a sample batch, "
                            "so each stage's variables are created on its device")

    def _remat(self, m):
        return self.remat == "always" or (self.remat == "except_last" and m < self.num_micro_batches - 1)

    def _recomputed_forward(self, s, x_in):
        """Stage s's forward through tf.recompute_grad: the tape keeps the input (in host memory
        with swap) and the forward runs again when the tape differentiates it."""
        structure = x_in

        def forward(*flat):
            with tf.device(self.devices[s]):
                x = tf.nest.map_structure(tf.identity, tf.nest.pack_sequence_as(structure, list(flat)))
                return self._stage_forward(s, x, True)

        if self.swap:
            with tf.device("/cpu:0"):
                x_in = tf.nest.map_structure(tf.identity, x_in)
        return tf.recompute_grad(forward)(*tf.nest.flatten(x_in))

    def _taped_forward(self, s, m, x_in, y, sample_weight, share):
        """Stage s's forward of micro-batch m under a tape; the last stage also computes its share of the loss."""
        tape = tf.GradientTape()
        with tape:
            if s > 0:
                tape.watch(x_in)
            y_out = self._recomputed_forward(s, x_in) if self._remat(m) else self._stage_forward(s, x_in, True)
            loss = None
            if s == self.num_stages - 1:
                loss = share * self.compute_loss(None, y, y_out, sample_weight)
        return tape, y_out, loss

    def train_step(self, data):
        self._require_built()
        x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(data)
        k, num_micro = self.num_stages, self.num_micro_batches
        batch = tf.shape(tf.nest.flatten(x)[0])[0]
        size = (batch + num_micro - 1) // num_micro
        bounds = [(tf.minimum(m * size, batch), tf.minimum((m + 1) * size, batch)) for m in range(num_micro)]

        def piece(structure, m):
            start, stop = bounds[m]
            return tf.nest.map_structure(lambda t: None if t is None else t[start:stop], structure)

        shares = [tf.cast(stop - start, tf.float32) / tf.cast(batch, tf.float32) for start, stop in bounds]
        clock = sorted(schedule.simulate(self.order).events, key=lambda e: (e[3], e[0]))
        variables = [self.stage_variables(s) for s in range(k)]
        summed = [[tf.zeros_like(v) for v in variables[s]] for s in range(k)]
        tapes, outputs, input_grads, last = {}, {}, {}, [None] * k
        backward_outputs = [[] for _ in range(k)]  # every gradient each stage's B(s, m) computed
        self.trace_counts.clear()

        for s, kind, m, _, _ in clock:
            deps = [t for t in tf.nest.flatten(last[s]) if t is not None] if last[s] is not None else []
            with tf.control_dependencies(deps), tf.device(self.devices[s]), tf.name_scope(micro_step_scope(s, kind, m)):
                if kind == "F":
                    if m == 0:
                        refuse_call_losses(self.stage_layers(s), s)
                    self.trace_counts[("F", s)] += 1
                    x_in = piece(x, m) if s == 0 else tf.identity(outputs[(s - 1, m)])
                    tape, y_out, loss = self._taped_forward(s, m, x_in, piece(y, m), piece(sample_weight, m), shares[m])
                    tapes[(s, m)] = (tape, x_in, y_out, loss)
                    if s == k - 1:
                        self.compiled_metrics.update_state(piece(y, m), y_out, piece(sample_weight, m))
                    outputs[(s, m)] = y_out
                    last[s] = y_out
                else:
                    self.trace_counts[("B", s)] += 1
                    weight_grads, computed, restores = self._backward(s, m, tapes.pop((s, m)), variables[s],
                                                                      input_grads)
                    summed[s] = [acc if g is None else acc + tf.convert_to_tensor(g)
                                 for acc, g in zip(summed[s], weight_grads)]
                    last[s] = computed + restores
                    backward_outputs[s] += computed
        summed = self._add_penalty_gradients(summed, variables)
        flat_vars = [v for vs in variables for v in vs]
        summed = [gate_stage_gradients(summed[s], backward_outputs[s]) for s in range(k)]
        flat_grads = [g for gs in summed for g in gs]
        self.optimizer.apply_gradients(zip(flat_grads, flat_vars))
        return self.get_metrics_result()

    def _backward(self, s: int, m: int, taped, stage_variables: list, input_grads: dict):
        """B(s, m): stage s's gradients for micro-batch m, from its tape (recomputing the forward where remat
        says so). Leaves the gradient for the previous stage's output in `input_grads`; returns (the weights'
        gradients, every gradient computed, the ops that restore non-trainable state after a recompute)."""
        tape, x_in, y_out, loss = taped
        state = []
        if self._remat(m):  # the gradient below recomputes the forward, BatchNorm updates included
            self.trace_counts[("R", s)] += 1
            state = [(v, v.read_value()) for v in self.stage_variables(s, trainable=False)]
        sources = list(stage_variables) + ([x_in] if s > 0 else [])
        if s == self.num_stages - 1:
            grads = tape.gradient(loss, sources)
        else:
            grads = tape.gradient(y_out, sources, output_gradients=input_grads.pop((s + 1, m)))
        with tf.control_dependencies([g for g in grads if g is not None]):
            restores = [v.assign(value) for v, value in state]  # statistics move once per micro-batch
        if s > 0:
            input_grads[(s, m)] = grads[-1]
        return grads[:len(stage_variables)], [g for g in grads if g is not None], restores

    def _add_penalty_gradients(self, summed: list, variables: list) -> list:
        """The loss (built on the last stage) carries every penalty for the loss metric, but differentiates only
        the last stage's; each other stage adds its own penalties' gradient here."""
        summed = list(summed)
        for s in range(self.num_stages - 1):
            with tf.device(self.devices[s]), tf.name_scope(f"stage{s}_penalty"), tf.GradientTape() as tape:
                penalties = weight_penalties(self.stage_layers(s))
                total = tf.add_n(penalties) if penalties else None
            if total is not None:
                grads = tape.gradient(total, variables[s])
                summed[s] = [acc if g is None else acc + tf.convert_to_tensor(g) for acc, g in zip(summed[s], grads)]
        return summed

    def describe(self) -> dict:
        """What the run record keeps: K, M, the balance, the stage placement."""
        return {"num_stages": self.num_stages, "num_micro_batches": self.num_micro_batches,
                "balance": self.balance if isinstance(self.balance, str) else list(self.balance),
                "stages": [[self.pipeline_layers[i].name for i in st] for st in self.stages or []],
                "devices": self.devices, "remat": self.remat, "schedule": self.schedule_name, "swap": self.swap,
                "expected_bubble": (self.num_stages - 1) / (self.num_micro_batches + self.num_stages - 1)}
