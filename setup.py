"""Builds the compiled hot paths (engine/native/*.pyx, appliance/nfs/onc/xdrcodec.pyx) during
`pip install -e .`; the rest of the project is declared in pyproject.toml. The extensions are
optional: without a compiler the install still succeeds and the engine and the NFS server run
their pure-Python fallbacks."""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython in the build environment: pure-Python install
    extensions = []
else:
    extensions = cythonize(
        [
            Extension(
                "engine.native.drivewriters",
                ["engine/native/drivewriters.pyx"],
                extra_compile_args=["-O2"],
                optional=True,
            ),
            Extension(
                "appliance.nfs.onc.xdrcodec",
                ["appliance/nfs/onc/xdrcodec.pyx"],
                extra_compile_args=["-O2"],
                optional=True,
            ),
            # fragment read buffers without zeroing, the event loop's in-memory reads
            Extension(
                "engine.native.fragmentio",
                ["engine/native/fragmentio.pyx"],
                extra_compile_args=["-O2"],
                optional=True,
            ),
        ],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )

setup(ext_modules=extensions)
