"""Allocators by spec: where each library lives and how a command is run under it.

An allocator is a shared library put in front of the program with LD_PRELOAD, plus the
environment variables that select a configuration. A spec (what --allocator, --allocators and
--baseline take) is one of: a name `meshalloc allocators` lists (`jemalloc`); meshalloc with a
configuration and option overrides (`meshalloc:3y+mesh_budget_permille=200`); or a path to any
shared object (`/opt/je/lib/libjemalloc.so.2`), which may take meshalloc options too when it is
a meshalloc build (`build/debug/src/libmeshalloc.so+mesh=0`). resolve() is the one parser.
"""

from __future__ import annotations

import functools
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
# The configurations the experiments compare, named once: "meshing off" is always 0n (no
# randomisation, no meshing: meshalloc as a plain size-class allocator), and the library's
# defaults are 3y.
MESH_OFF = "meshalloc:0n"
MESH_DEFAULT = "meshalloc:3y"
# meshalloc:3y+mesh_budget_permille=200+decay_ms=0: each `+name=value` sets one option of
# the library's table (docs/options.md) through its own MESHALLOC_<NAME> variable.
OPTION_SEPARATOR = "+"
OPTION_ASSIGN = "="
OPTION_VARIABLE_PREFIX = "MESHALLOC_"
# The library lists its options (name = value, one a line) on stderr at start-up when this is
# set; the spec parser reads the names from there rather than keeping a copy of the table.
SHOW_OPTIONS_VARIABLE = "MESHALLOC_SHOW_OPTIONS"
SHOWN_OPTION = re.compile(r"^  (\w+) = (.*)$", re.MULTILINE)
# What the library prints for a value it cannot use ("meshalloc: ignoring NAME=VALUE: why").
IGNORED_OPTION = re.compile(r"^meshalloc: ignoring (.*)$", re.MULTILINE)
# Any dynamically linked program that allocates: the library prints its options when it loads.
PROBE_PROGRAMS = ("true", "/bin/true", "/usr/bin/true")
PROBE_TIMEOUT_S = 30
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


def _project_library(relative: Path, build: Optional[Path] = None) -> Optional[Path]:
    build = build or paths.build_directory()
    if build is None:
        return None
    candidate = build / relative
    return candidate if candidate.is_file() else None


def _project_missing_note(relative: Path, build: Optional[Path] = None) -> str:
    build = build or paths.build_directory()
    where = build / relative if build else relative
    return f"not built ({where} is missing; run `make release`)"


def looks_like_path(name: str) -> bool:
    return "/" in name or bool(SHARED_OBJECT_PATTERN.search(name))


def known_names_text() -> str:
    configs = " ".join(f"meshalloc:{config}" for config in LISTED_CONFIGS)
    return (f"{', '.join(KNOWN_NAMES)}, {configs} (each meshalloc form may add +option=value), "
            "or a path to a .so")


def _probe_program() -> str:
    for candidate in PROBE_PROGRAMS:
        found = shutil.which(candidate)
        if found:
            return found
    raise MeshallocError("cannot check meshalloc options: no `true` program to load the library into")


def _clean_environment(library: Path, settings: Mapping[str, str]) -> Dict[str, str]:
    """The environment with no inherited MESHALLOC_* variable (none changes what the library
    reports), `settings`, and the library preloaded."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(OPTION_VARIABLE_PREFIX) and key != "LD_PRELOAD"}
    env.update(settings)
    env["LD_PRELOAD"] = str(library)
    return env


def _show_options(env: Mapping[str, str]) -> str:
    """What the preloaded library prints on stderr at start-up when asked to list its options."""
    env = dict(env)
    env[SHOW_OPTIONS_VARIABLE] = "1"
    try:
        done = subprocess.run([_probe_program()], env=env, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise MeshallocError(f"cannot load {env.get('LD_PRELOAD')} to check its options: {error}") from None
    return done.stderr


def shown_options(allocator: Allocator) -> Dict[str, str]:
    """The options as the library reports them under this allocator's environment (the one its
    runs get); {} for a library that does not list them (not meshalloc)."""
    if allocator.library is None:
        return {}
    return dict(SHOWN_OPTION.findall(_show_options(allocator.environment())))


def configuration_problem(allocator: Allocator) -> Optional[str]:
    """None when a meshalloc allocator runs as its spec says (mesh and randomize as its
    configuration names them, every numeric override as given), else what differs: an
    inherited variable the allocator does not clear could otherwise change what runs."""
    wanted: Dict[str, str] = {}
    config = allocator.set_env.get("MESHALLOC_CONFIG")
    if config:
        wanted = {"mesh": "true" if config[1] == "y" else "false", "randomize": config[0]}
    overrides = {variable[len(OPTION_VARIABLE_PREFIX):].lower(): value
                 for variable, value in allocator.set_env.items()
                 if variable.startswith(OPTION_VARIABLE_PREFIX) and variable != "MESHALLOC_CONFIG"}
    for option in overrides:
        wanted.pop(option, None)  # an override wins over the configuration, in the library too
    if not wanted and not overrides:
        return None
    shown = shown_options(allocator)
    if not shown:
        return None  # a library that does not list its options cannot be checked this way
    # Numbers are compared; other kinds (1 for true, 64K for 65536) print differently.
    wanted.update({option: str(int(value)) for option, value in overrides.items()
                   if value.isdigit() and shown.get(option, "").isdigit()})
    wrong = [f"{name}={shown.get(name)} (not {value})" for name, value in wanted.items() if shown.get(name) != value]
    return f"{allocator.name} runs with {', '.join(wrong)}" if wrong else None


@functools.lru_cache(maxsize=None)
def _library_options(library: Path, modified_ns: int) -> Tuple[str, ...]:
    del modified_ns  # part of the cache key only: a rebuilt library is asked again
    return tuple(name for name, _ in SHOWN_OPTION.findall(_show_options(_clean_environment(library, {}))))


def library_options(library: Path) -> Tuple[str, ...]:
    """The option names a meshalloc build declares (its table, as it prints it), in its order;
    empty for a library that is not meshalloc."""
    library = Path(library).resolve()
    return _library_options(library, library.stat().st_mtime_ns)


def option_variable(option: str) -> str:
    """The variable that sets one option: MESHALLOC_ and the name upper-cased, as the library
    derives it (docs/options.md)."""
    return OPTION_VARIABLE_PREFIX + option.upper()


def _parse_overrides(spec: str, texts: Sequence[str], library: Path) -> Dict[str, str]:
    """`name=value` texts -> {option: value}, every name one the library declares and every
    value one it accepts (it is asked: it prints a warning for a value it ignores)."""
    overrides: Dict[str, str] = {}
    for text in texts:
        name, assign, value = text.partition(OPTION_ASSIGN)
        name = name.strip().lower()
        if not assign or not name or not value:
            raise MeshallocError(f"expected +option=value in '{spec}', not '+{text}'")
        overrides[name] = value
    if not overrides:
        return overrides
    known = library_options(library)
    if not known:
        raise MeshallocError(f"'{spec}' sets options, but {library} does not list any (not a meshalloc build)")
    for name in overrides:
        if name not in known:
            raise MeshallocError(f"unknown meshalloc option '{name}' in '{spec}' (options: {', '.join(known)})")
    settings = {option_variable(name): value for name, value in overrides.items()}
    ignored = IGNORED_OPTION.findall(_show_options(_clean_environment(library, settings)))
    if ignored:
        raise MeshallocError(f"bad option value in '{spec}': the library says {ignored[0]}")
    return overrides


def _split_spec(spec: str) -> Tuple[str, List[str]]:
    """'meshalloc:3y+a=1+b=2' -> ('meshalloc:3y', ['a=1', 'b=2']). A path that exists as
    written keeps any '+' it contains."""
    if looks_like_path(spec) and Path(spec).expanduser().exists():
        return spec, []
    base, *options = spec.split(OPTION_SEPARATOR)
    return base, options


def _with_overrides(allocator: Allocator, spec: str, texts: Sequence[str]) -> Allocator:
    overrides = _parse_overrides(spec, texts, allocator.library)
    if not overrides:
        return allocator
    settings = {option_variable(name): value for name, value in overrides.items()}
    shown = "".join(f"{OPTION_SEPARATOR}{name}{OPTION_ASSIGN}{value}" for name, value in overrides.items())
    return Allocator(name=allocator.name + shown, library=allocator.library,
                     description=allocator.description + "; " + ", ".join(f"{key}={value}"
                                                                          for key, value in settings.items()),
                     set_env={**allocator.set_env, **settings}, unset_env=allocator.unset_env)


def resolve(name: str, build: Optional[Path] = None) -> Allocator:
    """The allocator a spec stands for (the project's own libraries from `build`, by default
    the build directory paths.build_directory() names); MeshallocError when it is unknown, not
    installed or sets an option the library does not have, with a message saying what to do."""
    spec = name.strip()
    if not spec:
        raise MeshallocError(f"empty allocator name (known: {known_names_text()})")
    base, options = _split_spec(spec)
    if looks_like_path(base) and not base.startswith("meshalloc" + CONFIG_SEPARATOR):
        return _with_overrides(_resolve_path(base), spec, options)
    allocator = _resolve_name(base, spec, build)
    if options and not base.lower().startswith("meshalloc"):
        raise MeshallocError(f"unknown allocator '{name}': only meshalloc takes +option=value "
                             f"(known: {known_names_text()})")
    return _with_overrides(allocator, spec, options)


def _resolve_name(base: str, spec: str, build: Optional[Path]) -> Allocator:
    name, _, config = base.partition(CONFIG_SEPARATOR)
    name = name.lower()
    if config and name != "meshalloc":
        raise MeshallocError(f"unknown allocator '{spec}': only meshalloc takes a configuration "
                             f"(known: {known_names_text()})")
    if name == "system":
        return Allocator(name=base, library=None, description="no LD_PRELOAD: the allocator the program links")
    if name == "glibc":
        library = _project_library(paths.GLIBC_SHIM_LIBRARY, build)
        if library is None:
            raise MeshallocError(f"allocator 'glibc' is {_project_missing_note(paths.GLIBC_SHIM_LIBRARY, build)}")
        return Allocator(name=base, library=library, description="glibc malloc through the project's shim")
    if name in SYSTEM_ALLOCATORS:
        soname, package = SYSTEM_ALLOCATORS[name]
        library = find_system_library(soname)
        if library is None:
            raise MeshallocError(f"allocator '{name}' is not installed ({soname} not found; "
                                 f"apt-get install {package}, or run `meshalloc allocators --install`)")
        return Allocator(name=base, library=library, description=f"{name} from Debian's {package}")
    if name == "meshalloc":
        library = _project_library(paths.MESHALLOC_LIBRARY, build)
        if library is None:
            raise MeshallocError(f"allocator 'meshalloc' is {_project_missing_note(paths.MESHALLOC_LIBRARY, build)}")
        if not config:
            return Allocator(name=base, library=library, description="meshalloc, library defaults")
        config = config.lower()
        if config not in MESHALLOC_CONFIGS:
            raise MeshallocError(f"unknown meshalloc configuration '{config}' in '{spec}' "
                                 f"(use one of {' '.join(LISTED_CONFIGS)}: randomisation 0/1/2/3, meshing n/y)")
        return Allocator(
            name=f"meshalloc{CONFIG_SEPARATOR}{config}",
            library=library,
            description=f"meshalloc, randomisation {config[0]}, meshing {'on' if config[1] == 'y' else 'off'}",
            set_env={"MESHALLOC_CONFIG": config},
            unset_env=MESHALLOC_CONFIG_OVERRIDES,
        )
    raise MeshallocError(f"unknown allocator '{spec}' (known: {known_names_text()})")


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


def split_list(text: str) -> List[str]:
    """The specs of a --allocators list or an alias variable: comma- or space-separated."""
    return [item for item in re.split(r"[,\s]+", text or "") if item]


def resolve_all(names: Sequence[str], build: Optional[Path] = None) -> List[Allocator]:
    allocators = [resolve(name, build) for name in names]
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
