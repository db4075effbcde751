import pytest

from rlplat.registry import DuplicateNameError, Registry, RegistryError, UnknownNameError


def make():
    reg = Registry("widget")

    @reg.register("alpha")
    def alpha():
        return "a"

    @reg.register()
    def beta():
        return "b"

    return reg


def test_register_and_get():
    reg = make()
    assert reg.names() == ("alpha", "beta")
    assert reg.get("alpha")() == "a"
    assert reg.get("beta")() == "b"  # default name: the function's __name__
    assert "alpha" in reg and "gamma" not in reg
    assert list(reg) == ["alpha", "beta"] and len(reg) == 2


def test_duplicate_refused_unless_explicit():
    reg = make()
    with pytest.raises(DuplicateNameError, match="widget 'alpha' is already registered.*replace=True"):
        reg.add("alpha", lambda: "other")
    reg.add("alpha", lambda: "other", replace=True)
    assert reg.get("alpha")() == "other"
    # re-registering the very same object (e.g. a module imported twice) is not an error
    same = reg.get("beta")
    reg.add("beta", same)


def test_unknown_name_lists_known_and_suggests():
    reg = make()
    with pytest.raises(UnknownNameError) as info:
        reg.get("alpah")
    assert str(info.value) == "unknown widget 'alpah'; did you mean 'alpha'? known: alpha, beta"
    with pytest.raises(UnknownNameError) as info:
        reg.get("zzz")
    assert str(info.value) == "unknown widget 'zzz'; known: alpha, beta"
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)


def test_bad_names():
    reg = make()
    with pytest.raises(RegistryError, match="non-empty strings"):
        reg.add("", object())
    with pytest.raises(UnknownNameError):
        reg.get(["not", "hashable"])


def test_temporary_and_isolated_do_not_leak():
    reg = make()
    with reg.temporary("gamma", lambda: "g") as fn:
        assert reg.get("gamma") is fn
    assert "gamma" not in reg
    with reg.isolated():
        reg.remove("alpha")
        reg.add("delta", object())
    assert reg.names() == ("alpha", "beta")
    # a failure inside the block still restores the registry
    with pytest.raises(RuntimeError):
        with reg.isolated():
            reg.add("epsilon", object())
            raise RuntimeError
    assert "epsilon" not in reg


def test_lazy_entry_imports_its_module_only_when_asked(tmp_path, monkeypatch):
    import sys

    (tmp_path / "lazy_plugin_mod.py").write_text("class Widget:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("widget")
    reg.add_lazy("w", "lazy_plugin_mod:Widget", requires=("json",))
    assert reg.names() == ("w",) and "lazy_plugin_mod" not in sys.modules
    assert reg.missing_requirements("w") is None
    assert reg.get("w").__name__ == "Widget" and "lazy_plugin_mod" in sys.modules
    assert reg.get("w") is reg.get("w")


def test_lazy_entry_with_a_missing_package_names_the_install_command():
    reg = Registry("rollout engine")
    reg.add_lazy("fancy", "fancy_engine_pkg.engine:Engine", requires=("fancy_engine_pkg",), install="pip install fancy")
    message = ("rollout engine 'fancy' needs the package 'fancy_engine_pkg', which is not installed; "
               "install it with: pip install fancy")
    assert reg.missing_requirements("fancy") == message
    with pytest.raises(RegistryError, match="install it with: pip install fancy"):
        reg.get("fancy")
    with pytest.raises(RegistryError, match="must be 'package.module:Attr'"):
        reg.add_lazy("bad", "no_colon")


def test_an_entry_imported_without_its_package_still_says_what_is_missing(tmp_path, monkeypatch):
    # planning a run for another machine imports the engine class without its package (require_installed=False);
    # a later run in the same process must still be told the package is missing, not fail inside a worker
    (tmp_path / "engine_without_pkg.py").write_text("class Engine:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("rollout engine")
    reg.add_lazy("fancy", "engine_without_pkg:Engine", requires=("fancy_engine_pkg",), install="pip install fancy")
    assert reg.get("fancy", require_installed=False).__name__ == "Engine"
    assert reg.missing_requirements("fancy").startswith("rollout engine 'fancy' needs the package 'fancy_engine_pkg'")
    with pytest.raises(RegistryError, match="install it with: pip install fancy"):
        reg.get("fancy")
