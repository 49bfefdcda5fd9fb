"""Package discovery: every folder under the project's top-level packages ships as ``omniduplex.<folder>``.

The repository root is the ``omniduplex`` namespace (``package_dir``), so a new module or subpackage needs no
listing; ``web/``, the stage graphs and the C++ sources ship as package data (``pyproject.toml``).
"""

from setuptools import find_namespace_packages, setup

TOP = ["app", "benchmarks", "cli", "kernels", "models", "pipeline", "relay", "web"]

setup(
    packages=[
        f"omniduplex.{p}"
        for p in find_namespace_packages(include=[*TOP, *(f"{t}.*" for t in TOP)])
        if not p.endswith("__pycache__")
    ],
    package_dir={"omniduplex": "."},
)
