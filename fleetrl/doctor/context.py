"""Everything a check gets: the config, the doctor's options and the config's view of the cluster."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetrl.doctor.cluster_view import ClusterView
from fleetrl.doctor.options import DoctorOptions


@dataclass
class Context:
    config: Any
    options: DoctorOptions = field(default_factory=DoctorOptions)
    cleanups: list[Callable[[], None]] = field(default_factory=list)  # run after the last check

    def __post_init__(self):
        self.view = ClusterView(self.config, node=self.options.node)
