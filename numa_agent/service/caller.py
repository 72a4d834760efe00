"""Who the callers are by name: the user database's names for uids and groups, for
status and quotas (the Caller value itself is numa_agent.core.caller's)."""

from __future__ import annotations

import grp
import os
import pwd
from typing import Callable

from numa_agent.admission.quota import Owner, Quotas

# uid -> user name, None when the user database has none: what `status` shows
# for an owner. The system's (NSS) by default; tests give their own.
UserNames = Callable[[int], "str | None"]


def system_user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


# uid -> its user name and the names of its groups, as a quota names them
# (admission/quota.py takes them as plain values). The system's by default.
Owners = Callable[[int], Owner]


def system_owner(uid: int) -> Owner:
    """The user database's name for `uid` and every group it is in (its primary
    group and getgrouplist's); a uid it does not know has no name and no group."""
    try:
        user = pwd.getpwuid(uid)
    except (KeyError, OverflowError):
        return Owner(uid)
    try:
        gids = os.getgrouplist(user.pw_name, user.pw_gid)
    except OSError:
        gids = [user.pw_gid]
    names = set()
    for gid in gids:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue  # a gid without a name: no [quotas] entry can name it
    return Owner(uid, user.pw_name, tuple(sorted(names)))


def unknown_quota_names(quotas: Quotas) -> list[str]:
    """The [quotas] keys naming a user or group the user database does not
    have, each "quotas.users.bob: no user named 'bob'"."""
    out = []
    for kind, names, lookup, what in (("users", quotas.users, pwd.getpwnam, "user"),
                                      ("groups", quotas.groups, grp.getgrnam, "group")):
        for name in names:
            try:
                lookup(name)
            except KeyError:
                out.append(f"quotas.{kind}.{name}: no {what} named {name!r} in the user database")
    return out
