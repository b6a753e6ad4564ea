"""Registries: the classes a package exports, and the import of every module of a package."""

from __future__ import annotations

import sys

from dmlkit.core.registry import Registry, import_submodules


def test_classes_in_lists_the_registered_classes_of_a_package_by_name():
    registry = Registry("thing")
    made = {name: type(name, (), {"__module__": module}) for name, module in
            [("Zeta", "pkg.z"), ("Alpha", "pkg.sub.a"), ("Other", "pkgother.a"), ("Top", "pkg")]}
    for name, cls in made.items():
        registry.register(name.lower())(cls)
    registry.register("factory")(lambda: None)  # not a class: not exported
    assert registry.classes_in("pkg") == {"Alpha": made["Alpha"], "Zeta": made["Zeta"]}
    assert list(registry.classes_in("pkg")) == ["Alpha", "Zeta"]


def test_import_submodules_imports_the_public_modules_in_name_order(tmp_path, monkeypatch):
    package = tmp_path / "dmlkit_test_plugins"
    package.mkdir()
    (package / "__init__.py").write_text("order = []\n")
    for name in ("beta", "alpha", "_private"):
        (package / f"{name}.py").write_text(f"from dmlkit_test_plugins import order\norder.append({name!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import dmlkit_test_plugins

        import_submodules("dmlkit_test_plugins", dmlkit_test_plugins.__path__)
        assert dmlkit_test_plugins.order == ["alpha", "beta"]
        assert dmlkit_test_plugins.alpha.__name__ == "dmlkit_test_plugins.alpha"
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "dmlkit_test_plugins"]:
            del sys.modules[name]


def test_every_registered_loss_is_exported_by_dmlkit_losses():
    import dmlkit.losses as losses

    for name in losses.LOSSES.names():
        cls = losses.LOSSES.get(name)
        assert getattr(losses, cls.__name__) is cls and cls.__name__ in losses.__all__
