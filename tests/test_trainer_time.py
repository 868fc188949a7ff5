"""Where the Trainer's time went, from fit's window and each part's own seconds."""
import pytest

from hpml.components.trainer.time_breakdown import PARTS, breakdown

HISTORY = [{"seconds": 3.0}, {"seconds": 2.0}]


def test_the_parts_add_up_to_the_trainers_time():
    spent = breakdown(100.0, 120.0, {"started_at": 104.0, "ended_at": 116.5}, HISTORY,
                      {"seconds": 1.5, "trace_s": 0.5}, {"seconds": 0.75})
    assert list(spent) == list(PARTS)
    assert spent == {"preparing": 2.5, "step_tuning": 1.0, "step_trace": 0.5, "epochs": 5.0,
                     "input_stall_probe": 0.75, "other_in_fit": 6.75, "after_training": 3.5}
    assert sum(spent.values()) == 20.0
    # A tuning reused from the cache traced nothing: fit traces the step inside its first epoch.
    reused = breakdown(100.0, 120.0, {"started_at": 104.0, "ended_at": 116.5}, HISTORY,
                       {"seconds": 0.0, "trace_s": 0.0, "reused": True}, None)
    assert reused["step_tuning"] == reused["step_trace"] == 0.0 and reused["preparing"] == 4.0


def test_without_a_window_of_this_attempt_there_is_no_breakdown():
    assert breakdown(100.0, 120.0, None, HISTORY, None, None) is None
    # A window outside this run_fn's time: written on another machine's clock, or by another attempt.
    assert breakdown(100.0, 120.0, {"started_at": 40.0, "ended_at": 60.0}, HISTORY, None, None) is None


def test_parts_measured_past_their_window_are_cut_to_it():
    """A history that holds an earlier attempt's epochs, or a tuning reused from the cache: no part is negative."""
    spent = breakdown(0.0, 10.0, {"started_at": 1.0, "ended_at": 5.0}, HISTORY * 3, {"seconds": 2.0}, None)
    assert spent == {"preparing": 0.0, "step_tuning": 1.0, "step_trace": 0.0, "epochs": 4.0,
                     "input_stall_probe": 0.0, "other_in_fit": 0.0, "after_training": 5.0}


def test_run_fn_runs_with_what_the_process_already_held_set_aside_from_the_collector_and_gets_it_back():
    """In `hpml run` the Trainer shares its process with Beam's and Transform's objects; every full collection
    while the training step traced scanned them all, which nearly doubled the trace at 1M rows."""
    import gc

    from hpml.components.trainer.executor import _run_in_process

    held = [[i] for i in range(10_000)]  # what earlier components left, still alive
    seen = {}

    def run_fn(_):
        seen["frozen"] = gc.get_freeze_count()
        raise ValueError("run_fn failed")

    assert gc.get_freeze_count() == 0
    with pytest.raises(ValueError, match="run_fn failed"):
        _run_in_process(run_fn, None, "GZIP")
    assert seen["frozen"] >= len(held), "set aside while run_fn ran"
    assert gc.get_freeze_count() == 0, "and back under the collector afterwards, failed or not"

    gc.freeze()  # a process that sets objects aside itself keeps them so
    try:
        _run_in_process(lambda _: None, None, "GZIP")
        assert gc.get_freeze_count() >= len(held)
    finally:
        gc.unfreeze()
