"""What a server does as one member of a group of servers: synchronous replication
(``sync``: a write is acknowledged once enough replicas hold it), and later leadership.

The service layer adapts these to gRPC; nothing here imports grpc.
"""
