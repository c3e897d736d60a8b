"""Builds the compiled OTLP decoder (coeffd/receivers/otlp/_wire.c) and the compiled RLS
fold (coeffd/learners/_fold.c); the rest of the configuration is in pyproject.toml.
``optional``: without a C compiler the install still succeeds and coeffd decodes and
learns in pure Python (coeffd.receivers.otlp.native and coeffd.learners.native say
which)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "coeffd.receivers.otlp._wire",
            ["coeffd/receivers/otlp/_wire.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "coeffd.learners._fold",
            ["coeffd/learners/_fold.c"],
            # no fused multiply-add: the fold rounds as Python's float operations do
            extra_compile_args=["-O2", "-ffp-contract=off"],
            optional=True,
        ),
    ]
)
