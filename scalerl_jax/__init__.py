import importlib.abc
import importlib.util
import sys
from pathlib import Path

from scalerl_jax.hostmem import reexec_for_cli

# experiments/ and benchmarks/ sit at the top of the repository and install as scalerl_jax.experiments and
# scalerl_jax.benchmarks (pyproject.toml, [tool.setuptools.package-dir]; docs/DESIGN.md, "Import names"). A checkout
# used without installing it (PYTHONPATH=<checkout>, as on the GPU machines) finds them through this finder, which
# answers for those two names only and comes after every other finder (an install's own copy wins).
_CHECKOUT = Path(__file__).resolve().parents[1]
_MAPPED = {"scalerl_jax.experiments": _CHECKOUT / "experiments", "scalerl_jax.benchmarks": _CHECKOUT / "benchmarks"}


class _CheckoutFolders(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        folder = _MAPPED.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


if (_CHECKOUT / "pyproject.toml").is_file() and all((f / "__init__.py").is_file() for f in _MAPPED.values()) \
        and not any(isinstance(f, _CheckoutFolders) for f in sys.meta_path):
    sys.meta_path.append(_CheckoutFolders())

# `python -m scalerl_jax.module` restarts once with huge pages for XLA's CPU buffers (scalerl_jax/hostmem.py)
reexec_for_cli()
