"""The claim log: which region's consumer handles which message, when two regions each hold a copy
of every message (``dispatcher.transports.geo``). The port is ``ports.ClaimLog``; the backends
(``sql``, ``cosmos``) are imported by name when wanted, so importing the port loads no driver.
"""

from dispatcher.claims.ports import BoundedClaimLog, ClaimEntry, ClaimLog, ClaimStatus, Taken

__all__ = ["BoundedClaimLog", "ClaimEntry", "ClaimLog", "ClaimStatus", "Taken"]
