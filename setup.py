"""Build of the optional C scan of the exact k-NN engine; everything else is in pyproject.toml.

The extension is optional: without a C compiler dmlkit installs and runs the same search in PyTorch
operations (``dmlkit.evaluation.knn``; results are identical, only slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dmlkit.evaluation._knn_scan",
            ["src/dmlkit/evaluation/_knn_scan.c"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        )
    ]
)
