"""The `hpml` command line: run pipelines, list and compare run records, open reports, run benchmarks."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from hpml.components import files
from hpml.components.errors import USER_ERROR_EXIT, HpmlError, interruption
from hpml.components.native_logs import VERBOSE_ENV, quiet_libraries, start_tensorflow
from hpml.pipelines import models_cli, runs_cli

INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


class _WithoutOurErrors(logging.Filter):
    """Drops a log record that carries one of our errors: Beam logs a DoFn's exception, traceback and all,
    before re-raising it, and `main` prints that error as one line and a hint."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], HpmlError))


def _setup_logging(debug: bool, verbose: bool) -> None:
    """hpml's own progress at info level; with --verbose, hpml's details (each tuner decision, every artifact
    path) and the libraries' info lines too; with --debug, everything."""
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO,
                        format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S", force=True)
    if verbose and not debug:
        logging.getLogger("hpml").setLevel(logging.DEBUG)
    if not (verbose or debug):
        quiet_libraries()
        logging.getLogger("airflow").setLevel(logging.WARNING)
        # MLflow configures its own logger when first imported, from this.
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
        # Airflow logs through structlog, which stdlib levels do not reach; its own setting does. A failed task's
        # traceback ("task" at error level) is left to --debug: the run ends in the component's one-line error.
        os.environ.setdefault("AIRFLOW__LOGGING__NAMESPACE_LEVELS", "airflow=WARNING task=CRITICAL")
        # Airflow's in-process test client warns about its own dependency on every run.
        warnings.filterwarnings("ignore", message=".*`httpx` with `starlette.testclient` is deprecated")
    if not debug:
        logging.getLogger("apache_beam.runners.common").addFilter(_WithoutOurErrors())


def _params(pipeline, pairs: list[str]) -> dict:
    from hpml.pipelines.params import parse_cli_value

    values = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise HpmlError(f"--param {pair!r} is not NAME=VALUE", hint="e.g. --param epochs=5")
        values[name] = parse_cli_value(pipeline.params_schema, name, text)
    return values


def cmd_run(args) -> int:
    from hpml.pipelines import discovery, records
    from hpml.pipelines.summary import print_summary

    pipeline = discovery.load(args.pipeline)
    values = pipeline.validate(_params(pipeline, args.param))
    if args.verbose or args.debug:
        os.environ[VERBOSE_ENV] = "1"  # the Trainer's worker processes inherit it
    start_tensorflow(verbose=args.verbose or args.debug)
    mlflow_run_id: str | None
    if args.engine == "local":
        from hpml.pipelines import runner

        context = runner.run_local(pipeline, values)
        mlflow_run_id = context.mlflow_run_id
    else:
        from hpml.pipelines.airflow import local as airflow_local

        airflow_local.migrate()
        airflow_local.load_airflow()  # which replaces this process's logging with its own, at info level
        _setup_logging(args.debug, args.verbose)  # so ours again: the lines the local engine prints
        dag_run = airflow_local.test_run(args.pipeline, values)
        state = str(getattr(dag_run, "state", "")).lower()
        mlflow_run_id = records.find("airflow.run_id", dag_run.run_id, pipeline.name)
        if not state.endswith("success"):
            _raise_recorded_failure(mlflow_run_id, f"Airflow DAG run {dag_run.run_id} ended in state {state}")
        if mlflow_run_id is None:
            raise HpmlError(f"no run record found for Airflow run {dag_run.run_id}")
    print_summary(records.load(mlflow_run_id))
    return 0


def cmd_init(args) -> int:
    from hpml.pipelines import scaffold

    profile, written = scaffold.init_project(args.name, args.csv, args.label, directory=args.dir,
                                             dags_folder=args.dags_folder, task=args.task, force=args.force)
    classes = f" ({len(profile.classes)} classes)" if profile.classes else ""
    print(f"{args.name}: {profile.task} of {profile.label!r}{classes} from {len(profile.numeric)} numeric and "
          f"{len(profile.categorical)} text column(s), {profile.rows} rows")
    if profile.renamed:
        print("features renamed (their column names cannot name a feature): " +
              ", ".join(f"{column!r} -> {feature}" for column, feature in profile.renamed))
    if profile.empty:
        print(f"left out (no value in any row): {', '.join(profile.empty)}")
    for kind in ("pipeline", "module", "dag"):
        print(f"wrote {written[kind]}")
    folder = os.path.dirname(written["pipeline"])
    where = "" if os.path.dirname(folder) == os.getcwd() else f"HPML_PIPELINES_PATH={os.path.dirname(folder)} "
    print(f"next: {where}hpml run {args.name}")
    return 0


def _raise_recorded_failure(mlflow_run_id: str | None, fallback: str) -> None:
    """The failed component's own error and hint, read from the run record, as the local engine would print
    them; Airflow ran it in a task process, so the exception itself never reaches this one."""
    from hpml.pipelines import records

    tags = records.load(mlflow_run_id).tags if mlflow_run_id else {}
    error, node = tags.get("hpml.error"), tags.get("hpml.failed_node")
    if not (error and node):
        raise HpmlError(fallback, hint="--debug shows the tasks' own logs, which name the failing component")
    if error == "KeyboardInterrupt":  # Ctrl-C reached the task, which Airflow records as a failure
        raise KeyboardInterrupt
    raise HpmlError(f"{node} failed: {error}",
                    hint=tags.get("hpml.error_hint") or f"{fallback}; --debug shows the task's traceback")


def cmd_report(args) -> int:
    from hpml.pipelines import records, report

    mlflow_run_id = records.resolve(args.run)
    run_dir = records.load(mlflow_run_id).tags.get("hpml.run_dir")
    path = report.report_path(run_dir) if run_dir else None
    if args.rebuild or not path or not files.isfile(path):
        path = report.build(mlflow_run_id)
    print(path)
    if args.open:
        import webbrowser

        if not webbrowser.open(f"file://{path}"):
            print("note: no web browser could be started here (none found, or it failed); open the path above, "
                  "or name one in BROWSER", file=sys.stderr)
    return 0


BENCHMARKS = ("distributed", "gpipe", "distillation", "input_pipeline", "input_peers", "callbacks", "trainer_step",
              "end_to_end")


def cmd_bench(args) -> int:
    import subprocess
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    names = args.names or list(BENCHMARKS)
    for name in names:
        if name not in BENCHMARKS:
            raise HpmlError(f"unknown benchmark {name!r}", hint=f"one of: {', '.join(BENCHMARKS)}")
        if not (folder / f"{name}.py").is_file():
            raise HpmlError(f"benchmark script {folder / f'{name}.py'} is missing",
                            hint="benchmarks run from a checkout of the repository")
    for name in names:
        print(f"== benchmark {name}: results in benchmarks/results/{name}.md", flush=True)
        done = subprocess.run([sys.executable, str(folder / f"{name}.py"), *args.extra], cwd=folder.parent)
        if done.returncode != 0:
            raise HpmlError(f"benchmark {name} failed with exit code {done.returncode}")
    return 0


# What a bug report needs besides hpml's own version: the libraries that run its components.
_VERSIONED = ("tensorflow", "tf-keras", "tensorflow-transform", "tfx-bsl", "apache-beam", "apache-airflow", "mlflow")


def version_text() -> str:
    """`hpml 0.2.0`, then the installed versions of the libraries hpml runs on, read from package metadata
    so that nothing is imported."""
    from importlib import metadata

    from hpml import __version__

    found = []
    for name in _VERSIONED:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return f"hpml {__version__}\n" + "\n".join(f"  {line}" for line in found)


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print hpml's version and its libraries' versions, and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpml", description="High-performance ML pipelines on Airflow.")
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors, and debug logging")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show the details: each input-pipeline decision, every artifact path, TensorFlow's "
                             "start-up lines, and Airflow's and MLflow's own logs")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a pipeline and print its summary")
    run.add_argument("pipeline", help="an installed pipeline's name (e.g. penguin), a folder hpml init wrote, "
                                      "module:ATTRIBUTE, or a pipeline.py file")
    run.add_argument("--engine", choices=("airflow", "local"), default="local",
                     help="airflow: a real DAG run (dag.test) on a private SQLite Airflow under HPML_HOME; "
                          "local: run the components in this process")
    run.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                     help="a pipeline parameter (repeatable), e.g. --param epochs=5")
    run.set_defaults(func=cmd_run)

    init = sub.add_parser("init", help="write a pipeline for your own CSV: NAME/pipeline.py, module.py, dag.py")
    init.add_argument("name", help="the pipeline's name: a folder of that name is written")
    init.add_argument("--csv", required=True, help="a CSV file with a header row")
    init.add_argument("--label", required=True, help="the column to predict")
    init.add_argument("--task", choices=("classification", "regression"), default=None,
                      help="default: classification for a text label or one of whole numbers with at most "
                           "20 values, else regression")
    init.add_argument("--dir", default=".", help="where to write the NAME folder (default: here)")
    init.add_argument("--dags-folder", default=None, metavar="DIR",
                      help="write the DAG file into this Airflow dags_folder as NAME.py, instead of NAME/dag.py")
    init.add_argument("--force", action="store_true", help="overwrite files that exist")
    init.set_defaults(func=cmd_init)

    runs_cli.add_parser(sub)

    report = sub.add_parser("report", help="print the path of a run's HTML report (writing it if missing)")
    report.add_argument("run", help="MLflow run id (or a unique prefix of one, as hpml runs shows it), "
                        "or the run's name (hpml or Airflow run id)")
    report.add_argument("--open", action="store_true", help="also open it in a web browser")
    report.add_argument("--rebuild", action="store_true", help="write it again from the run record")
    report.set_defaults(func=cmd_report)

    models_cli.add_parser(sub)

    bench = sub.add_parser("bench", help="run benchmarks; each writes benchmarks/results/<name>.json and .md")
    bench.add_argument("names", nargs="*", metavar="NAME", help=f"any of: {', '.join(BENCHMARKS)} (default: all)")
    bench.add_argument("--arg", dest="extra", action="append", default=[], metavar="ARG",
                       help="passed to each benchmark script, e.g. --arg=--repeats --arg=7")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.debug, args.verbose)
    try:
        return args.func(args)
    except HpmlError as err:
        if args.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        if err.hint:
            print(f"hint: {err.hint}", file=sys.stderr)
        return USER_ERROR_EXIT
    except Exception as err:
        if interruption(err) is None or args.debug:
            raise
        return _interrupted(args)  # Ctrl-C, which a library's clean-up turned into an error of its own
    except KeyboardInterrupt:  # Ctrl-C: the run record already says where it stopped
        if args.debug:
            raise
        return _interrupted(args)


def _interrupted(args) -> int:
    """Two lines for Ctrl-C, and the status a shell gives a command it stopped."""
    print("error: interrupted", file=sys.stderr)
    if args.func is cmd_run:
        print("hint: hpml runs lists it as FAILED, with the component it stopped in", file=sys.stderr)
    return INTERRUPTED_EXIT


if __name__ == "__main__":
    sys.exit(main())
