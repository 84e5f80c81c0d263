"""Transient API failures are waited out, not turned into task failures: the retry policy of every
Kubernetes call on the operator's path (execute, execute_complete, cleanup).

An API server restart (connection refused for a few seconds), a 5xx from a busy control plane or a
429 from API Priority and Fairness says nothing about the task, so it must not spend an Airflow
retry. The client retries such a call with exponential back-off (Retry-After honoured) for about
RETRY_WINDOW_SECONDS, then the error goes up as it would have. Every method is retried, creates
included: the operator's creates are find-or-create by deterministic name (a create whose answer was
lost comes back 409 and is adopted) and its deletes ignore 404.
"""

from __future__ import annotations

import copy

import urllib3
from kubernetes import client

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
BACKOFF_FACTOR = 0.5  # 0.5, 1, 2, 4, 8 s, then BACKOFF_MAX
BACKOFF_MAX = 10.0
ATTEMPTS = 11  # about 75 s of back-off in all: API server restarts measured at 0.9-4.9 s
RETRY_WINDOW_SECONDS = sum(min(BACKOFF_MAX, BACKOFF_FACTOR * 2 ** i) for i in range(ATTEMPTS - 1))


def transient_retry(attempts: int = ATTEMPTS) -> urllib3.Retry:
    """urllib3's policy for a transient failure: connection errors, read errors, TRANSIENT_STATUS."""
    return urllib3.Retry(total=attempts, connect=attempts, read=attempts, status=attempts, other=0, redirect=0,
                         status_forcelist=TRANSIENT_STATUS, allowed_methods=None, backoff_factor=BACKOFF_FACTOR,
                         backoff_max=BACKOFF_MAX, respect_retry_after_header=True, raise_on_status=False)


def with_retries(api_client: client.ApiClient, attempts: int = ATTEMPTS) -> client.ApiClient:
    """A client like `api_client` (same server, credentials, TLS) whose calls wait out transient
    failures. A new client: the pool of the given one was built without the policy."""
    configuration = copy.copy(api_client.configuration)
    configuration.retries = transient_retry(attempts)
    return client.ApiClient(configuration)
