"""The public names of each package: ``__all__`` is exactly what the package's namespace offers
(every public name listed, nothing listed that is not there), sorted, so a new public class cannot
be forgotten in ``__all__`` and a name cannot be exported by accident (docs/design.md, public names).
Submodules and subpackages are not names of the API: the import system binds them on the package."""

from __future__ import annotations

import importlib
import types

import pytest

import flightfeed.wire.errors as errors

PACKAGES = ["flightfeed.client", "flightfeed.wire", "flightfeed.server"]


def _public(module: types.ModuleType) -> list[str]:
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and name != "annotations"
    ]


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_exactly_the_public_names_sorted(package: str) -> None:
    module = importlib.import_module(package)
    exported = list(module.__all__)
    assert exported == sorted(exported, key=str.casefold), f"{package}.__all__ is not sorted"
    assert sorted(exported) == sorted(_public(module)), f"{package}.__all__ differs from its public names"


@pytest.mark.parametrize("package", ["flightfeed.client", "flightfeed.wire"])
def test_every_error_of_the_tree_is_exported(package: str) -> None:
    module = importlib.import_module(package)
    tree = [
        name for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.FlightFeedError)
    ]
    assert {"ConfigError", "DatasetError", "ShardError", "StorageError", "DiskFull", "PermissionDenied"} <= set(tree)
    missing = sorted(set(tree) - set(module.__all__))
    assert not missing, f"{package} does not export {missing}"
    for name in tree:
        assert getattr(module, name) is getattr(errors, name)


def test_the_tree_drawn_in_the_docstring_is_the_tree() -> None:
    doc = errors.__doc__ or ""
    for name, value in vars(errors).items():
        if isinstance(value, type) and issubclass(value, errors.FlightFeedError):
            parent = value.__mro__[1].__name__
            assert f" {name} " in doc.replace("──", " "), f"{name} is not drawn in flightfeed.wire.errors' docstring"
            if value is not errors.FlightFeedError:
                assert doc.index(parent) < doc.index(f" {name} "), f"{name} is drawn before its parent {parent}"
