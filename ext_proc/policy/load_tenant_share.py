"""Policy loading for tenant shares: a pool's ``tenant_shares`` block → ``TenantShares``
(see load.py for the file as a whole). Every problem raises ``PolicyError`` naming the field."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ext_proc._pb import policy_pb2
from ext_proc.policy.errors import PolicyError
from ext_proc.policy.load_fields import opt
from ext_proc.policy.settings import TenantShares
from ext_proc.policy.tenant_share import share_problems

__all__ = ["tenant_shares_specs"]


def tenant_shares_specs(
    pools: Mapping[str, policy_pb2.Pool],
) -> MappingProxyType[str, TenantShares]:
    """Pool name → its tenants' shares, for each pool that sets ``tenant_shares``."""
    out: dict[str, TenantShares] = {}
    for name, msg in pools.items():
        if not msg.HasField("tenant_shares"):
            continue
        m = msg.tenant_shares
        shares = TenantShares(
            cap=opt(m, "cap", 1.0),
            caps=MappingProxyType(dict(m.caps)),
            guaranteed=MappingProxyType(dict(m.guaranteed)),
        )
        problems = share_problems(shares)
        if problems:
            raise PolicyError(f"pools.{name}.tenant_shares.{problems[0]}")
        out[name] = shares
    return MappingProxyType(out)
