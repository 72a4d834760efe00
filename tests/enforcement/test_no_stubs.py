"""Each enforcer fills the roles it claims with real code: no role method that
only returns a constant, passes or raises to satisfy the Protocol. A role one
enforcer cannot fill is a capability the caller asks for (`engines_of`,
`kept_records`), not a stub. The few constant answers that are the true answer
of a mechanism are listed below, each with its reason; a new one has to be
argued for here."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from numa_agent.enforcement.protocol import (
    Applying,
    EngineCgroups,
    KeptRecords,
    Records,
    Tracking,
    engines_of,
    kept_records,
)

ROLES = (Applying, Tracking, Records)
CAPABILITIES = (EngineCgroups, KeptRecords)
ENFORCERS = (CgroupEnforcer, AffinityEnforcer)

# (class, method) -> why its constant answer is the mechanism's real one.
LEGIT = {
    ("AffinityEnforcer", "setup"): "sched_setaffinity needs nothing made before use: no tree, no controllers",
    ("AffinityEnforcer", "verify"): "nothing to read back: a pin either took or raised, and children inherit it",
    ("AffinityEnforcer", "path_of"): "the documented answer where a workload has no directory to show",
}


def role_methods(role: type) -> list[str]:
    return sorted(name for name, value in vars(role).items()
                  if not name.startswith("_") and callable(value) and not isinstance(value, property))


def claimed(cls: type) -> list[str]:
    roles = ROLES + tuple(cap for cap in CAPABILITIES if all(hasattr(cls, n) for n in role_methods(cap)))
    return sorted({name for role in roles for name in role_methods(role)})


def stub_kind(func) -> str | None:
    """What makes `func` a stub ("pass", "return constant", "raise"), None when it does work."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    body = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if not body:
        return "docstring only"
    if len(body) > 1:
        return None
    only = body[0]
    if isinstance(only, ast.Pass):
        return "pass"
    if isinstance(only, ast.Raise):
        return "raise"
    if isinstance(only, ast.Return):
        value = only.value
        if value is None or isinstance(value, ast.Constant):
            return "return constant"
        if isinstance(value, (ast.List, ast.Tuple, ast.Dict, ast.Set)) and not getattr(value, "elts", getattr(value, "keys", None)):
            return "return empty"
        if isinstance(value, ast.Name) and value.id.isupper():
            return "return constant"
    return None


def test_the_detector_tells_stubs_from_work():
    def a(self): pass  # noqa: E704
    def b(self): return None  # noqa: E704
    def c(self): return []  # noqa: E704
    def d(self): raise NotImplementedError  # noqa: E704
    def e(self): return self.x  # noqa: E704

    def f(self):
        """Only words."""

    assert [stub_kind(x) for x in (a, b, c, d, e, f)] == [
        "pass", "return constant", "return empty", "raise", None, "docstring only"]


def test_every_role_method_is_the_enforcers_own():
    for cls in ENFORCERS:
        for name in claimed(cls):
            assert name in vars(cls), f"{cls.__name__}.{name} is not defined by the class itself"


@pytest.mark.parametrize("cls", ENFORCERS, ids=lambda c: c.__name__)
def test_no_role_method_is_a_stub(cls):
    stubs = {name: kind for name in claimed(cls)
             if (kind := stub_kind(vars(cls)[name])) is not None and (cls.__name__, name) not in LEGIT}
    assert stubs == {}, f"{cls.__name__} fills these role methods with stubs: {stubs}"


def test_every_listed_constant_answer_is_still_one():
    # The list cannot grow stale: each entry names a method that still answers a constant.
    for (cls_name, name), reason in LEGIT.items():
        cls = {c.__name__: c for c in ENFORCERS}[cls_name]
        assert reason and stub_kind(vars(cls)[name]) is not None, (cls_name, name)


def test_only_the_cgroup_enforcer_enforces_on_engines_cgroups():
    assert claimed(CgroupEnforcer) != claimed(AffinityEnforcer)
    assert set(role_methods(EngineCgroups)) <= set(claimed(CgroupEnforcer))
    assert engines_of(AffinityEnforcer("test")) is None
    assert not any(hasattr(AffinityEnforcer, n) for n in role_methods(EngineCgroups))


def test_only_the_cgroup_enforcer_keeps_records_beside_the_checkpoint():
    # sched_setaffinity keeps nothing that outlives the agent: no record, no
    # limits, no leftovers, no grant. The callers ask, as for engines' cgroups.
    assert set(role_methods(KeptRecords)) == {"read_limits", "write_record", "read_record", "prune", "granted"}
    assert set(role_methods(KeptRecords)) <= set(claimed(CgroupEnforcer))
    assert kept_records(AffinityEnforcer("test")) is None
    assert not any(hasattr(AffinityEnforcer, n) for n in role_methods(KeptRecords))
