"""Only the optional native part; everything else is in pyproject.toml.

The Kineto importer's scan (diagnose/importers/_kineto_c.c) is built when a C
compiler is there; without one the install goes on and the importer uses its
msgspec path (diagnose/importers/kineto_scan.py), slower but the same result.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "diagnose.importers._kineto_c",
            ["diagnose/importers/_kineto_c.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
