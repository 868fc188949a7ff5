"""Small helpers the test modules share. They live here, not in conftest.py: pytest imports conftest as
`conftest`, so `from tests.conftest import ...` would run it a second time, and a second run starts a new
session HPML_HOME in the middle of the session."""

TINY_EPOCHS = 3  # epochs of the shared penguin DAG run


def write_csv(path, header: str, rows: list[str]) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(header + "\n" + "".join(r + "\n" for r in rows))
    return str(path)
