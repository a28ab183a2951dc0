"""The fast default: fork the ranks from a template that imported torch once, when that is safe.

``--preload torch`` makes N ranks pay for one ``import torch`` (seconds each) instead of N, but
torch is then imported *before* the script runs, in a template whose environment is what all
ranks share. That changes nothing the script can see when

1. the script's top-level statements before its first ``import torch`` are only imports,
   docstrings and ``from __future__``: nothing it does could have run before torch's import
   anyway (decided by parsing the file, never by running it); and
2. every environment variable torch (and the libraries it loads: OpenMP, MKL, oneDNN,
   OpenBLAS, numpy) reads while it is imported has the same value, or is unset, in every rank:
   the template then has exactly each rank's value, as it keeps what all ranks share.

Otherwise the ranks start as usual, each importing torch itself. ``--preload none`` turns the
default off and ``--preload torch`` forces it (see docs/launch.md).

The variables were found by importing torch under a ``getenv`` interposer (C and C++ readers)
and a wrapper around ``os.environ`` (Python readers): :data:`IMPORT_ENV_PREFIXES` covers each
family found, :data:`IMPORT_ENV_NAMES` the rest.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence

from .command import EntryKind, WorkerCommand

__all__ = ["IMPORT_ENV_NAMES", "IMPORT_ENV_PREFIXES", "auto_preload", "read_at_torch_import"]

#: What the default preloads.
MODULES = ("torch",)

IMPORT_ENV_PREFIXES = (
    # OpenMP (libgomp, Intel's) and the BLAS/MKL/oneDNN thread pools, set up when loaded
    "OMP_", "GOMP_", "KMP_", "MKL_", "MKLDNN_", "ONEDNN_", "DNNL_", "OPENBLAS_", "GOTO_",
    # torch's own settings, read by c10 and by modules that torch imports
    "TORCH_", "TORCHDYNAMO_", "TORCHINDUCTOR_", "TORCHEXPORT_", "PYTORCH_", "COMPILE_STROBELIGHT_",
    "FX_", "KINETO_",
    # devices, numpy, the Fortran runtime and MPI hints of the math libraries
    "CUDA_", "HIP_", "ROCR_", "NPY_", "NUMPY_", "GFORTRAN_", "I_MPI_", "ACC_", "OPENSSL_",
)  # fmt: skip
IMPORT_ENV_NAMES = frozenset(
    {
        "INTEL_LIBITTNOTIFY64",
        "MPI_LOCALNRANKS",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
    }
)


def read_at_torch_import(name: str) -> bool:
    """Whether importing torch may read environment variable ``name``."""
    return name in IMPORT_ENV_NAMES or name.startswith(IMPORT_ENV_PREFIXES)


def _imports_torch(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Import):
        return any(alias.name == "torch" or alias.name.startswith("torch.") for alias in stmt.names)
    if isinstance(stmt, ast.ImportFrom):
        module = stmt.module or ""
        return stmt.level == 0 and (module == "torch" or module.startswith("torch."))
    return False


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def script_problem(source: str, filename: str) -> str | None:
    """Why preloading torch could change what the script ``source`` sees; None: it cannot."""
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError) as err:
        return f"it does not parse ({err.__class__.__name__}); it reports that itself"
    for stmt in tree.body:
        if _imports_torch(stmt):
            return None
        if isinstance(stmt, (ast.Import, ast.ImportFrom)) or _is_docstring(stmt):
            continue
        return f"line {stmt.lineno} runs before its first `import torch`"
    return "it has no top-level `import torch`"


def env_problem(envs: Sequence[Mapping[str, str]]) -> str | None:
    """The first variable read at torch's import whose value differs between ranks, if any."""
    names = {name for env in envs for name in env if read_at_torch_import(name)}
    for name in sorted(names):
        values = {env.get(name) for env in envs}
        if len(values) > 1:
            return f"{name} differs between ranks"
    return None


def auto_preload(
    command: WorkerCommand | None, envs: Sequence[Mapping[str, str]]
) -> tuple[tuple[str, ...], str]:
    """The default ``--preload``: (modules, why). Torch when it is safe (module docstring)."""
    if command is None or command.kind not in (EntryKind.SCRIPT, EntryKind.RUN_PATH):
        return (), "only a script file can be checked"
    try:
        with open(command.target, "rb") as fp:
            source = fp.read()
    except OSError as err:
        return (), f"{command.target} cannot be read ({err.strerror}); the workers report it"
    problem = script_problem(source.decode("utf-8", "replace"), command.target) or env_problem(envs)
    if problem is not None:
        return (), f"{command.target}: {problem}"
    return MODULES, f"{command.target} imports torch first"
