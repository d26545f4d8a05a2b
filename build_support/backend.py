"""PEP 517 build backend: setuptools, plus descriptor generation from ``protos/``.

Why a wrapper rather than a ``setup.py`` command: editable installs (PEP 660) skip most
setuptools commands, and setuptools already checks that ``api_versions/_generated`` exists
in its metadata hooks. Generation therefore runs first in every hook that builds or
inspects the package, so a fresh clone never depends on generated files being committed.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import build_meta as _setuptools

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
OUT = ROOT / "api_versions" / "_generated"

ConfigSettings = dict[str, str | list[str]] | None


def generate_descriptors() -> list[Path]:
    """Compile every ``protos/<generation>/api.proto`` to a binary FileDescriptorSet.

    One set per generation, loaded at run time into a private descriptor pool: v1alpha1 and
    v1alpha2 both declare ``deviceplugin.*`` with incompatible ``AllocateResponse`` types, so
    they cannot share protobuf's default pool the way ``*_pb2.py`` modules would.
    """
    from grpc_tools import protoc  # build-time dependency only

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "__init__.py").write_text('"""Generated at build time from protos/; never edit."""\n')
    written = []
    for proto in sorted(PROTOS.glob("*/api.proto")):
        target = OUT / f"{proto.parent.name}.binpb"
        args = [
            "protoc",
            f"--proto_path={PROTOS}",
            f"--descriptor_set_out={target}",
            str(proto.relative_to(PROTOS)),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
        written.append(target)
    if not written:
        raise RuntimeError(f"no protos found under {PROTOS}")
    return written


def get_requires_for_build_wheel(config_settings: ConfigSettings = None) -> list[str]:
    generate_descriptors()
    return _setuptools.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings: ConfigSettings = None) -> list[str]:
    generate_descriptors()
    return _setuptools.get_requires_for_build_editable(config_settings)


def get_requires_for_build_sdist(config_settings: ConfigSettings = None) -> list[str]:
    return _setuptools.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: ConfigSettings = None
) -> str:
    generate_descriptors()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: ConfigSettings = None
) -> str:
    generate_descriptors()
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(
    wheel_directory: str,
    config_settings: ConfigSettings = None,
    metadata_directory: str | None = None,
) -> str:
    generate_descriptors()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(
    wheel_directory: str,
    config_settings: ConfigSettings = None,
    metadata_directory: str | None = None,
) -> str:
    generate_descriptors()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory: str, config_settings: ConfigSettings = None) -> str:
    generate_descriptors()
    return _setuptools.build_sdist(sdist_directory, config_settings)


if __name__ == "__main__":
    for path in generate_descriptors():
        print(path.relative_to(ROOT))
