"""The TFX adapter: hpml's components as TFX components. Needs `tfx` (1.16 on Python 3.10, or 1.21)."""
