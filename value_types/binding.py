"""What a claim's allocation asks of the driver before its pod binds, and what it was told.

KEP-5007: the scheduler copies a device's ``bindingConditions`` and
``bindingFailureConditions`` into each allocation result, then waits until every binding
condition is True in the claim's ``status.devices[]`` entry for that device, or any failure
condition is. :mod:`api_versions.claim_binding` reads both from a claim of any version.
"""

from __future__ import annotations

from dataclasses import dataclass

from value_types.claims import AllocationResult


@dataclass(frozen=True, slots=True)
class BindingState:
    """One allocation result of the driver's, with the conditions the scheduler waits on."""

    result: AllocationResult
    conditions: tuple[str, ...]
    """The result's ``bindingConditions`` (empty: the scheduler does not wait on it)."""
    failure_conditions: tuple[str, ...]
    true: frozenset[str] = frozenset()
    """Condition types the claim's status entry for this device has True now."""

    @property
    def settled(self) -> bool:
        """Every binding condition True, or a failure condition True: nothing to do."""
        return all(c in self.true for c in self.conditions) or \
            any(c in self.true for c in self.failure_conditions)
