"""Builds the compiled OTLP decoder (coeffd/receivers/otlp/_wire.c); the rest of the
configuration is in pyproject.toml. ``optional``: without a C compiler the install still
succeeds and coeffd decodes in pure Python (coeffd.receivers.otlp.native says which)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "coeffd.receivers.otlp._wire",
            ["coeffd/receivers/otlp/_wire.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
