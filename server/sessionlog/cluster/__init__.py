"""A group of servers: who leads it, and how leadership changes hands.

    promotion.py   a running replica becomes the primary (AdminService.Promote); fences
    rejoin.py      a deposed primary becomes a replica of the new one (``replica rejoin``)
    sync.py        --ack replica: writes wait for replicas to report them durable
    syncset.py     a leader's synchronous set in etcd: who may take over from it
    member.py      --cluster: the election's roles mapped onto a running server
    settings.py    --cluster, --group, --advertise, --lease-ttl
    election.py    a member of an etcd-elected group (roles, ``may_write``)
    members.py     its etcd keys, the position guard and the synchronous-set rule
    fence.py       the self-fence deadline of a leader's lease
    etcd.py        bounded calls to etcd's JSON gateway

The durable state promotion and rejoin change is storage's (``storage.leadership``,
``storage.rebuild``): this package decides *when*, in what order, and what to tell people.
The election modules talk to etcd only; ``member`` maps their roles onto a server through the
promoter and a small ``Host`` interface that the composition implements (``sessionlog.server``,
which imports ``member`` only for a server started with --cluster).
Nothing here imports the service, the web console or the composition, and this package
imports none of its modules: a server that runs no election never loads etcd's client.
"""
