"""Automatic failover through etcd: settings, the member's election, its self-fence.

The server composes these (``sessionlog.server``); nothing here imports the service, the web
console or the composition. ``settings`` parses the flags; ``election.Member`` is the member
(roles, ``may_write``); ``members`` holds the keys and the position guard; ``fence`` the
deadline; ``etcd`` the bounded calls to etcd's JSON gateway.
"""

from sessionlog.cluster.election import Fenced, Follow, Lead, Member, Role, Timing
from sessionlog.cluster.fence import LeaseDeadline
from sessionlog.cluster.members import GroupKeys, MemberRecord, Progress, members_ahead
from sessionlog.cluster.settings import ClusterSettings, Endpoint, cluster_settings

__all__ = [
    "ClusterSettings",
    "Endpoint",
    "Fenced",
    "Follow",
    "GroupKeys",
    "Lead",
    "LeaseDeadline",
    "Member",
    "MemberRecord",
    "Progress",
    "Role",
    "Timing",
    "cluster_settings",
    "members_ahead",
]
