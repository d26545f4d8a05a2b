"""How hard one negotiation round tries a generation that fails transiently.

Kept free of gRPC imports so the command line can build a policy from flags without
loading the RPC stack (``healthcheck`` runs every few seconds as a liveness probe).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    jitter: float = 0.05
    register_timeout: float = 15.0
