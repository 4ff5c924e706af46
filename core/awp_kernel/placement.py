"""A task's placement: the labels it requires and prefers, the resources it reserves
and whether it sticks to its run's last worker (docs/workflows.md "Placement").

The grant (awp_db.grant) copies it onto each dispatch; the claim (awp_db.placement)
leases a dispatch only to a worker that meets it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from awp_protocol.placement import labels_problems, resources_problems


@dataclass(frozen=True, slots=True)
class Placement:
    required_labels: tuple[str, ...] = ()
    preferred_labels: tuple[str, ...] = ()
    # (resource, units) pairs, sorted by resource name.
    resources: tuple[tuple[str, int], ...] = ()
    sticky: bool = False

    @classmethod
    def of(
        cls,
        required_labels: tuple[str, ...] | list[str] = (),
        preferred_labels: tuple[str, ...] | list[str] = (),
        resources: Mapping[str, int] | None = None,
        sticky: bool = False,
    ) -> Placement:
        return cls(
            tuple(required_labels),
            tuple(preferred_labels),
            tuple(sorted((resources or {}).items())),
            sticky,
        )

    def __bool__(self) -> bool:
        return bool(self.required_labels or self.preferred_labels or self.resources or self.sticky)

    def to_json(self) -> dict[str, Any]:
        """Only what is set, so that a definition without placement keeps its JSON."""
        data: dict[str, Any] = {}
        if self.required_labels:
            data["required_labels"] = list(self.required_labels)
        if self.preferred_labels:
            data["preferred_labels"] = list(self.preferred_labels)
        if self.resources:
            data["resources"] = dict(self.resources)
        if self.sticky:
            data["sticky"] = True
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Placement:
        return cls.of(
            data.get("required_labels", ()),
            data.get("preferred_labels", ()),
            data.get("resources"),
            data.get("sticky", False),
        )


def violations(placement: Placement) -> list[tuple[str, str]]:
    """(field, description) for each bad part of one task's placement."""
    return (
        labels_problems(placement.required_labels, "required_labels")
        + labels_problems(placement.preferred_labels, "preferred_labels")
        + resources_problems(dict(placement.resources), "units")
    )
