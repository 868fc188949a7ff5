"""Penguin species from palmerpenguins measurements: ExampleGen -> Transform -> Trainer."""
