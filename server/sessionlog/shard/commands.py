"""`sessionlog cluster ...`: the commands that work on a sharded cluster's configuration."""

from __future__ import annotations

from typing import Any

from sessionlog.shard import haproxy


def add_commands(commands: Any) -> None:
    """Register the `cluster` command group on the `sessionlog` parser."""
    cluster = commands.add_parser(
        "cluster",
        help="sharded clusters: routing configuration",
        description="Commands for a cluster of groups that share the sessions by slot.",
    )
    actions = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    haproxy.add_command(actions)
