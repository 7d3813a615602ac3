"""Several processes serving one data folder: ``sessionlog serve --workers N``.

    supervisor (sessionlog serve)          holds the folder lock, the ports, the doorbells
      ├─ worker 0  SessionLogServer ─┐
      ├─ worker 1  SessionLogServer ─┼─ the same LMDB environment, the same gRPC and HTTP ports
      └─ worker N-1 ...             ─┘   (SO_REUSEPORT: the kernel spreads connections)

A Python process runs its event loop on one core, so a server uses more than one core only by
being several processes. LMDB is built for that: readers in any process never lock, and one
write lock in the shared ``lock.mdb`` serializes the writers of every process, so each worker
keeps its own writer thread and group commit. Every decision (seqs, ``expected_seq``, request
ids, leases, fork and create checks, change-feed positions and checksums) is read inside the
write transaction from what LMDB holds, never from a process's memory: per-process state is a
cache checked against storage (the memoized folds) or about that process alone (its streams).

The pieces, each in its module:

- ``supervisor``: takes the folder lock (the workers inherit it: one server owns the folder,
  a second is refused), opens the store once to check it and work out its history, reserves
  the ports, starts the workers (fresh interpreters, never a fork of a process that has
  started gRPC), restarts one that dies, and drains them all on SIGTERM;
- ``worker``: a worker's entry point: today's ``SessionLogServer`` with ``Peers``;
- ``service.doorbell`` (below the server, which rings and answers the bells): cross-process
  wakeups. A commit in one worker rings the others' eventfds;
  a rung worker reads the change feed past what it has seen and wakes its followers of the
  sessions written there (a doorbell carries no data, so none can be lost: a bell rung
  while another is pending is one read of the feed, covering both);
- ``service.shared_counts``: every worker's open streams and heartbeat, in shared memory;
- ``ports``: checks that no other server listens on an address, then holds it for the workers.
"""
