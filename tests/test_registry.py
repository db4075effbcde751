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
