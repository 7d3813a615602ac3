"""Benchmarks for sessionlog, each measured next to a ceiling taken in the same run.

``python -m bench`` (or ``make bench``) starts a real ``sessionlog serve`` and a bare gRPC echo
server as subprocesses on 127.0.0.1, drives them from client subprocesses, times bare LMDB
commits in a temp dir, and prints one table: case, sessionlog figure, ceiling figure, ratio, with
latency and the CPU both sides used. See bench/README.md for what each case measures.

Modules: ``common`` (settings, events, measurements), ``procs`` (server subprocesses),
``load`` (the load generator), ``h2load`` (the compiled load client for the unary cases),
``echo`` (the echo server), ``cases`` (sessionlog), ``ceilings`` (echo and LMDB), ``tail``
(case 5), ``derive`` (case 6), ``sessions`` (case 7), ``peer`` (Redis), ``etcd`` (the etcd
peer), ``workers`` (the cases at ``--workers 1`` and ``--workers N``), ``report`` (table and
JSON).
"""
