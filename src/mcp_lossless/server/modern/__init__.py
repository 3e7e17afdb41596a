"""The 2026-07-28 leg of the endpoint: stateless requests, and tools that run as tasks (docs/decisions/0012).

Every request stands alone: no session is minted, nothing is resumable, and a client that closes the response
has cancelled the request (the legacy leg keeps running the tool). Durable work goes through the tasks extension
instead: a tool declared ``task=True``, called by a client that declared the extension, is stored as a task
before ``CreateTaskResult`` is sent, runs detached from the request, and is polled with ``tasks/get``. A
``tools/call`` carrying an idempotency key (SEP-3182, docs/decisions/0029) runs detached and has its answer
stored as the key's outcome.

One module per concern, as h11 cuts its connection: :mod:`.routing` (validation and the method table),
:mod:`.inline` (a request answered on its own response), :mod:`.tasks` (create, run, poll, update, cancel,
stream), :mod:`.listen` (``subscriptions/listen``), :mod:`.keyed` (idempotency keys), :mod:`.replies` (the
shapes they all answer in). Each part is given the part of the server's state it reads.
"""

from .routing import ModernLeg

__all__ = ["ModernLeg"]
