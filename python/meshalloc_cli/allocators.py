"""Allocators by name: where each library lives and how a command is run under it.

An allocator is a shared library put in front of the program with LD_PRELOAD, plus the
environment variables that select a configuration (for meshalloc's paper configurations).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from . import paths
from .errors import EXIT_FAILURE, MeshallocError

# The artifact's names for meshalloc's configurations: randomisation level 0/1/2 and
# meshing n(o)/y(es). The library reads them from MESHALLOC_CONFIG; "1n" is accepted by
# the library too, although the paper never ran it, and so is level 3 (rotated runs, not
# the paper's: see docs/heap.md).
MESHALLOC_CONFIGS = ("0n", "1n", "2n", "3n", "0y", "1y", "2y", "3y")
PAPER_CONFIGS = ("0n", "2n", "0y", "1y", "2y")
# What `meshalloc allocators` lists and error messages suggest: the paper's five and the
# library's default level with meshing on.
LISTED_CONFIGS = PAPER_CONFIGS + ("3y",)
CONFIG_SEPARATOR = ":"
# Variables that would override MESHALLOC_CONFIG inside the library; a named
# configuration must mean exactly what its name says, so they are removed for it.
MESHALLOC_CONFIG_OVERRIDES = ("MESHALLOC_CONFIG", "MESHALLOC_MESH", "MESHALLOC_RANDOMIZE")

# The comparison allocators and the Debian packages that ship them.
SYSTEM_ALLOCATORS: Dict[str, Tuple[str, str]] = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc2"),
    "mimalloc": ("libmimalloc.so.2", "libmimalloc2.0"),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
}
DEBIAN_PACKAGES = tuple(package for _, package in SYSTEM_ALLOCATORS.values())

# The allocators `meshalloc allocators` lists, in display order.
KNOWN_NAMES = ("glibc", "jemalloc", "mimalloc", "tcmalloc", "meshalloc", "system")

# Library directories searched when ldconfig cannot answer (e.g. a minimal container).
FALLBACK_LIBRARY_DIRS = ("/usr/lib/{triplet}", "/lib/{triplet}", "/usr/local/lib", "/usr/lib64", "/usr/lib", "/lib")
ELF_MAGIC = b"\x7fELF"
# e_machine is a 16-bit field at this offset of every ELF header.
ELF_MACHINE_OFFSET = 18
ELF_MACHINE_SIZE = 2
ELF_HEADER_PREFIX = ELF_MACHINE_OFFSET + ELF_MACHINE_SIZE
# A library file name: anything ending in .so or .so.<version>.
SHARED_OBJECT_PATTERN = re.compile(r"\.so(\.\d+)*$")
LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")


@dataclass(frozen=True)
class Allocator:
    """One allocator to run a command under."""

    name: str  # as the user wrote it, e.g. "meshalloc:0n"
    library: Optional[Path]  # what LD_PRELOAD gets; None runs the program as it is linked
    description: str
    set_env: Mapping[str, str] = field(default_factory=dict)
    unset_env: Tuple[str, ...] = ()

    def environment(self, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """The environment for a command run under this allocator.

        Any inherited LD_PRELOAD is dropped: a comparison measures one allocator at a time,
        and a library the user happened to preload would otherwise sit in every run."""
        env = dict(os.environ if base is None else base)
        env.pop("LD_PRELOAD", None)
        for name in self.unset_env:
            env.pop(name, None)
        env.update(self.set_env)
        if self.library is not None:
            env["LD_PRELOAD"] = str(Path(self.library).resolve())  # ld.so resolves a relative path against the cwd
        return env


@dataclass(frozen=True)
class Availability:
    """One row of `meshalloc allocators`."""

    name: str
    library: Optional[Path]
    available: bool
    note: str


def _elf_machine(path: Path) -> Optional[bytes]:
    try:
        with open(path, "rb") as handle:
            header = handle.read(ELF_HEADER_PREFIX)
    except OSError:
        return None
    if len(header) < ELF_HEADER_PREFIX or not header.startswith(ELF_MAGIC):
        return None
    return header[ELF_MACHINE_OFFSET:ELF_HEADER_PREFIX]


def _our_machine() -> Optional[bytes]:
    """The ELF machine of the running interpreter: a library for another architecture
    (a multilib i386 copy, say) cannot be preloaded into our programs."""
    return _elf_machine(Path("/proc/self/exe"))


def _multiarch_triplet() -> str:
    import sysconfig

    return sysconfig.get_config_var("MULTIARCH") or ""


def _ldconfig_cache() -> Dict[str, List[Path]]:
    """soname -> paths from the dynamic loader's cache (`ldconfig -p`)."""
    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if not ldconfig:
        return {}
    try:
        listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return {}
    cache: Dict[str, List[Path]] = {}
    for line in listing.splitlines():
        match = LDCONFIG_LINE.match(line)
        if match:
            cache.setdefault(match.group(1), []).append(Path(match.group(3)))
    return cache


def find_system_library(soname: str) -> Optional[Path]:
    """The installed library with this soname for our architecture, or None."""
    machine = _our_machine()
    candidates = list(_ldconfig_cache().get(soname, []))
    triplet = _multiarch_triplet()
    for pattern in FALLBACK_LIBRARY_DIRS:
        directory = pattern.format(triplet=triplet)
        if "{triplet}" in pattern and not triplet:
            continue
        candidates.append(Path(directory) / soname)
    for candidate in candidates:
        if candidate.is_file() and (machine is None or _elf_machine(candidate) == machine):
            return candidate.resolve()
    return None


def _project_library(relative: Path) -> Optional[Path]:
    build = paths.build_directory()
    if build is None:
        return None
    candidate = build / relative
    return candidate if candidate.is_file() else None


def _project_missing_note(relative: Path) -> str:
    build = paths.build_directory()
    where = build / relative if build else relative
    return f"not built ({where} is missing; run `make release`)"


def looks_like_path(name: str) -> bool:
    return "/" in name or bool(SHARED_OBJECT_PATTERN.search(name))


def known_names_text() -> str:
    configs = " ".join(f"meshalloc:{config}" for config in LISTED_CONFIGS)
    return f"{', '.join(KNOWN_NAMES)}, {configs}, or a path to a .so"


def resolve(name: str) -> Allocator:
    """The allocator a user-facing name stands for; MeshallocError when it is unknown or
    not installed, with a message saying what to do."""
    spec = name.strip()
    if not spec:
        raise MeshallocError(f"empty allocator name (known: {known_names_text()})")
    if looks_like_path(spec) and not spec.startswith("meshalloc" + CONFIG_SEPARATOR):
        return _resolve_path(spec)
    base, _, config = spec.partition(CONFIG_SEPARATOR)
    base = base.lower()
    if config and base != "meshalloc":
        raise MeshallocError(f"unknown allocator '{name}': only meshalloc takes a configuration "
                             f"(known: {known_names_text()})")
    if base == "system":
        return Allocator(name=spec, library=None, description="no LD_PRELOAD: the allocator the program links")
    if base == "glibc":
        library = _project_library(paths.GLIBC_SHIM_LIBRARY)
        if library is None:
            raise MeshallocError(f"allocator 'glibc' is {_project_missing_note(paths.GLIBC_SHIM_LIBRARY)}")
        return Allocator(name=spec, library=library, description="glibc malloc through the project's shim")
    if base in SYSTEM_ALLOCATORS:
        soname, package = SYSTEM_ALLOCATORS[base]
        library = find_system_library(soname)
        if library is None:
            raise MeshallocError(f"allocator '{base}' is not installed ({soname} not found; "
                                 f"apt-get install {package}, or run `meshalloc allocators --install`)")
        return Allocator(name=spec, library=library, description=f"{base} from Debian's {package}")
    if base == "meshalloc":
        library = _project_library(paths.MESHALLOC_LIBRARY)
        if library is None:
            raise MeshallocError(f"allocator 'meshalloc' is {_project_missing_note(paths.MESHALLOC_LIBRARY)}")
        if not config:
            return Allocator(name=spec, library=library, description="meshalloc, library defaults")
        config = config.lower()
        if config not in MESHALLOC_CONFIGS:
            raise MeshallocError(f"unknown meshalloc configuration '{config}' in '{name}' "
                                 f"(use one of {' '.join(LISTED_CONFIGS)}: randomisation 0/1/2/3, meshing n/y)")
        return Allocator(
            name=f"meshalloc{CONFIG_SEPARATOR}{config}",
            library=library,
            description=f"meshalloc, randomisation {config[0]}, meshing {'on' if config[1] == 'y' else 'off'}",
            set_env={"MESHALLOC_CONFIG": config},
            unset_env=MESHALLOC_CONFIG_OVERRIDES,
        )
    raise MeshallocError(f"unknown allocator '{name}' (known: {known_names_text()})")


def _resolve_path(spec: str) -> Allocator:
    path = Path(spec).expanduser()
    if not path.exists():
        raise MeshallocError(f"allocator library not found: {spec}")
    if not path.is_file() or _elf_machine(path) is None:
        raise MeshallocError(f"allocator library is not an ELF shared object: {spec}")
    machine = _our_machine()
    if machine is not None and _elf_machine(path) != machine:
        raise MeshallocError(f"allocator library is built for another architecture: {spec}")
    # LD_PRELOAD resolves relative paths against the program's working directory, so
    # always hand it an absolute one.
    library = path.resolve()
    return Allocator(name=spec, library=library, description=f"preloaded {library.name}")


def resolve_all(names: Sequence[str]) -> List[Allocator]:
    allocators = [resolve(name) for name in names]
    seen = set()
    for allocator in allocators:
        if allocator.name in seen:
            raise MeshallocError(f"allocator '{allocator.name}' is listed twice")
        seen.add(allocator.name)
    return allocators


def availability() -> List[Availability]:
    """What `meshalloc allocators` shows: every known name, found or not."""
    rows: List[Availability] = []
    for name in KNOWN_NAMES:
        try:
            allocator = resolve(name)
        except MeshallocError as error:
            rows.append(Availability(name, None, False, str(error)))
            continue
        rows.append(Availability(name, allocator.library, True, allocator.description))
        if name == "meshalloc":
            for config in LISTED_CONFIGS:
                configured = resolve(f"meshalloc{CONFIG_SEPARATOR}{config}")
                rows.append(Availability(configured.name, configured.library, True,
                                         f"{configured.description} (MESHALLOC_CONFIG={config})"))
    return rows


def install_debian_packages(runner=subprocess.run) -> None:
    """apt-get install the comparison allocators; needs root."""
    if os.geteuid() != 0:
        raise MeshallocError(f"installing needs root: run `sudo apt-get install {' '.join(DEBIAN_PACKAGES)}`",
                             EXIT_FAILURE)
    if not shutil.which("apt-get"):
        raise MeshallocError("apt-get not found: install " + " ".join(DEBIAN_PACKAGES) + " with your package manager",
                             EXIT_FAILURE)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "--no-install-recommends", *DEBIAN_PACKAGES]
    if runner(install, env=env, check=False).returncode == 0:
        return
    # A fresh machine has no package lists yet; fetch them once and retry.
    runner(["apt-get", "update"], env=env, check=False)
    if runner(install, env=env, check=False).returncode != 0:
        raise MeshallocError("apt-get install " + " ".join(DEBIAN_PACKAGES) + " failed", EXIT_FAILURE)
