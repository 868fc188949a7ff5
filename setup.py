"""Maps the repository's top-level folders into one installed package, `hpml`.

The repository keeps its folders where a reader looks for them (components/, pipelines/, examples/);
installed, they are hpml.components, hpml.pipelines and hpml.examples, and site-packages holds only `hpml`.
Everything else about the build is in pyproject.toml.
"""
from setuptools import find_packages, setup

FOLDERS = {"hpml": "hpml", "hpml.components": "components", "hpml.pipelines": "pipelines",
           "hpml.examples": "examples"}

setup(
    package_dir=FOLDERS,
    packages=[f"{package}.{sub}" if sub else package
              for package, folder in FOLDERS.items() for sub in ["", *find_packages(folder)]],
)
