"""sparsetorch._after_import: functions run on a module once it is imported (the hook that applies
sparsetorch's adjustments to torch's compiler when dynamo loads)."""

import sys

from sparsetorch import _after_import as ai


def test_runs_after_the_import_once_and_at_once_when_imported(tmp_path, monkeypatch):
    (tmp_path / "st_after_probe.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    ai.after_import("st_after_probe", lambda m: seen.append(m.VALUE + 1))
    assert seen == [] and ai._HOOK in sys.meta_path
    import st_after_probe  # noqa: F401

    assert seen == [42]
    ai.after_import("st_after_probe", lambda m: seen.append(m.VALUE))  # already imported: now
    assert seen == [42, 41]
    sys.modules.pop("st_after_probe", None)


def test_other_finders_still_answer_and_none_is_skipped(tmp_path, monkeypatch):
    """The hook answers with the spec of the finders after it and never removes itself mid-walk (a finder removed
    from sys.meta_path while the import system walks it made the next finder be skipped)."""
    calls = []

    class Probe:
        def find_spec(self, name, path=None, target=None):
            if name.startswith("st_after_"):
                calls.append(name)
            return None

    probe = Probe()
    monkeypatch.setattr(sys, "meta_path", [ai._HOOK, probe, *[f for f in sys.meta_path if f is not ai._HOOK]])
    (tmp_path / "st_after_two.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    ai.after_import("st_after_two", lambda m: seen.append(m.X))
    import st_after_two  # noqa: F401

    assert seen == [1] and calls and ai._HOOK in sys.meta_path and probe in sys.meta_path
    sys.modules.pop("st_after_two", None)


def test_a_loader_it_cannot_wrap_runs_the_functions_at_the_next_import(tmp_path, monkeypatch):
    import importlib.abc
    import importlib.util
    import types

    class OldLoader(importlib.abc.Loader):  # load_module only: no exec_module to wrap
        def load_module(self, name):
            mod = types.ModuleType(name)
            mod.Y = 7
            sys.modules[name] = mod
            return mod

    assert not hasattr(OldLoader(), "exec_module")

    class Finder:
        def find_spec(self, name, path=None, target=None):
            if name == "st_after_old":
                return importlib.util.spec_from_loader(name, OldLoader())
            return None

    monkeypatch.setattr(sys, "meta_path", [ai._HOOK, Finder(), *[f for f in sys.meta_path if f is not ai._HOOK]])
    seen = []
    ai.after_import("st_after_old", lambda m: seen.append(m.Y))
    import st_after_old  # noqa: F401

    (tmp_path / "st_after_next.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    import st_after_next  # noqa: F401 - any later import flushes the waiting functions

    assert seen == [7]
    for name in ("st_after_old", "st_after_next"):
        sys.modules.pop(name, None)
