"""The control plane's errors (etcd, the election). Registered with the service's error codes,
so a client that imported simsearch.pyramid raises these same classes (docs/cluster.md)."""

from __future__ import annotations

from ...service.errors import ServiceUnavailableError, register_error


@register_error()
class CoordinationError(ServiceUnavailableError):
    """The cluster's coordination service (etcd) could not be reached or did not answer in time:
    retry, the cluster state is unchanged or the change is safe to repeat (docs/cluster.md)."""


@register_error()
class NotLeaderError(CoordinationError):
    """This coordinator is not (or no longer) the elected leader, so it refuses the change: send
    it to the current leader (docs/cluster.md)."""


@register_error()
class PartUnavailableError(ServiceUnavailableError):
    """No replica of a part answered (in time): transient, retry (a client catching
    ServiceUnavailableError catches it)."""
