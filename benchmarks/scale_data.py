"""The scale benchmark's data: a CSV of 16 numeric columns, 4 text columns (8 to 32 values each) and a binary
label, written in blocks so that generating 10M rows takes little memory. Deterministic for a seed."""
from __future__ import annotations

import argparse

import numpy as np

FLOAT_COLUMNS = [f"f{i}" for i in range(12)]
INT_COLUMNS = [f"n{i}" for i in range(4)]
TEXT_COLUMNS = {f"t{i}": 8 * (i + 1) for i in range(4)}  # t0..t3 with 8, 16, 24, 32 values
LABEL = "label"
HEADER = [*FLOAT_COLUMNS, *INT_COLUMNS, *TEXT_COLUMNS, LABEL]
_BLOCK = 100_000


def write_csv(path: str, rows: int, seed: int = 0) -> str:
    """Writes `rows` rows to `path` (plain CSV with a header row); about 160 bytes a row."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    rng = np.random.default_rng(seed)
    vocab = {name: np.array([f"{name}_value_{j}" for j in range(size)]) for name, size in TEXT_COLUMNS.items()}
    schema = pa.schema([(name, pa.string()) for name in HEADER])
    with open(path, "wb") as sink:  # a plain header: TFX's CsvExampleGen keeps the quotes of a quoted one
        sink.write((",".join(HEADER) + "\n").encode())
    with open(path, "ab") as sink, pcsv.CSVWriter(sink, schema, write_options=pcsv.WriteOptions(
            include_header=False, quoting_style="none")) as writer:
        for start in range(0, rows, _BLOCK):
            n = min(_BLOCK, rows - start)
            floats = rng.normal(size=(n, len(FLOAT_COLUMNS))) * 100
            columns = [pa.array(np.char.mod("%.4f", floats[:, i])) for i in range(len(FLOAT_COLUMNS))]
            columns += [pa.array(rng.integers(0, 10_000, n).astype(str)) for _ in INT_COLUMNS]
            columns += [pa.array(vocab[name][rng.integers(0, size, n)]) for name, size in TEXT_COLUMNS.items()]
            label = (floats[:, 0] + floats[:, 1] > 0).astype(int).astype(str)
            writer.write(pa.RecordBatch.from_arrays([*columns, pa.array(label)], schema=schema))
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path")
    parser.add_argument("rows", type=int)
    args = parser.parse_args()
    write_csv(args.path, args.rows)
