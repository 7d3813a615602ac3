"""sessionlog_client: talk to a sessionlog server from an agent worker.

    from sessionlog_client import Client, event

    with Client("127.0.0.1:50051") as client:
        client.append("demo", [event("user_message", {"content": "What is LMDB?"})])
        print(client.chat_messages("demo"))          # OpenAI chat format
        with client.follow("demo") as events:         # resumes by itself after a restart
            for ev in events:
                print(ev.seq, ev.data)

``Client`` blocks, ``AsyncClient`` is its asyncio twin. Errors are the server's own classes
(``sessionlog_client.errors`` is generated from ``server/sessionlog/errors.py``). The generated
messages live in ``sessionlog_client.v1``.
"""

from sessionlog_client import errors
from sessionlog_client._aio import (
    AsyncAppendStream,
    AsyncClient,
    AsyncEventStream,
    AsyncSessionsStream,
)
from sessionlog_client._common import DEFAULT_MAX_MESSAGE_BYTES, Popped, Retry
from sessionlog_client._status import Cancelled, DeadlineExceeded, TransportError
from sessionlog_client._sync import AppendStream, Client, EventStream, SessionsStream
from sessionlog_client.convert import (
    event,
    event_from_dict,
    event_from_message,
    event_to_dict,
    event_type,
    message_from_dict,
    message_to_dict,
    messages_from_dicts,
    messages_to_dicts,
    role_name,
    struct_to_dict,
    type_name,
    usage_to_dict,
)
from sessionlog_client.errors import SessionLogError
from sessionlog_client.v1.event_pb2 import Event, EventType, SurfaceOp
from sessionlog_client.v1.message_pb2 import Message, Role

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "AppendStream",
    "AsyncAppendStream",
    "AsyncClient",
    "AsyncEventStream",
    "AsyncSessionsStream",
    "Cancelled",
    "Client",
    "DeadlineExceeded",
    "Event",
    "EventStream",
    "EventType",
    "Message",
    "Popped",
    "Retry",
    "Role",
    "SessionLogError",
    "SessionsStream",
    "SurfaceOp",
    "TransportError",
    "errors",
    "event",
    "event_from_dict",
    "event_from_message",
    "event_to_dict",
    "event_type",
    "message_from_dict",
    "message_to_dict",
    "messages_from_dicts",
    "messages_to_dicts",
    "role_name",
    "struct_to_dict",
    "type_name",
    "usage_to_dict",
]
