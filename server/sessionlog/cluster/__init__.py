"""Leadership of a group of servers: epochs, promotion, fencing and rejoin.

    promotion.py   a running replica becomes the primary (AdminService.Promote); fences
    rejoin.py      a deposed primary becomes a replica of the new one (``replica rejoin``)

The durable state they change is storage's (``storage.leadership``, ``storage.rebuild``):
this package decides *when*, in what order, and what to tell people.
"""
