"""What an hour of each host class costs: amortized hardware price plus energy.

cost of a condition = sum over hosts of hours_h * (price_per_hour + power_w / 1000 * kwh_price),
where hours_h is the host's own measured span (its clock). Power is the host's measured mean
power where its agent sampled one (`agents.power`: nvidia-smi, tegrastats, RAPL), else the
class's nominal figure. The defaults are planning figures (list prices over three years of
continuous use); a YAML file of the same shape overrides the electricity price and the
classes it names (`testbed costs --file FILE` shows the table that results).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from testbed.core.errors import BadInputError
from testbed.core.loading import load_model
from testbed.topo.classes import host_classes

HOURS_3_YEARS = 3 * 365 * 24


class HostCost(BaseModel):
    model_config = ConfigDict(extra="forbid")

    price_per_hour: float = Field(ge=0, description="amortized hardware price, USD per hour")
    power_w: float = Field(ge=0, description="nominal power draw under load, W")


DEFAULT_CLASSES: dict[str, HostCost] = {
    "pi5": HostCost(price_per_hour=80 / HOURS_3_YEARS, power_w=8),
    "jetson-orin-nano": HostCost(price_per_hour=500 / HOURS_3_YEARS, power_w=15),
    "jetson-orin-nano-super": HostCost(price_per_hour=250 / HOURS_3_YEARS, power_w=25),
    "a100": HostCost(price_per_hour=15000 / HOURS_3_YEARS, power_w=400),
    "a100x2": HostCost(price_per_hour=2 * 15000 / HOURS_3_YEARS, power_w=2 * 400),
    "a100x4": HostCost(price_per_hour=4 * 15000 / HOURS_3_YEARS, power_w=4 * 400),
    "l4": HostCost(price_per_hour=2500 / HOURS_3_YEARS, power_w=72),
    "h200": HostCost(price_per_hour=30000 / HOURS_3_YEARS, power_w=700),
    "cpu-server": HostCost(price_per_hour=3000 / HOURS_3_YEARS, power_w=150),
}


class CostTable(BaseModel):
    """Per-host-class costs and the electricity price."""

    model_config = ConfigDict(extra="forbid")

    kwh_price: float = Field(0.30, ge=0, description="electricity, USD per kWh")
    classes: dict[str, HostCost] = Field(default_factory=lambda: dict(DEFAULT_CLASSES))

    def hourly(self, host_class: str, power_w: float | None = None) -> float | None:
        """USD per hour of one host of this class; None for a class not in the table."""
        cost = self.classes.get(host_class)
        if cost is None:
            return None
        watts = cost.power_w if power_w is None else power_w
        return cost.price_per_hour + watts / 1000 * self.kwh_price


def read_cost_file(path: Path) -> CostTable:
    """The file as written (classes it does not name are absent); every class must be a host
    class (`testbed.topo.classes`), else a BadInputError naming the file and key."""
    given = load_model(CostTable, path)
    if "classes" not in given.model_fields_set:
        given = given.model_copy(update={"classes": {}})
    for name in given.classes:
        if name not in host_classes():
            known = ", ".join(host_classes())
            raise BadInputError(f"{path}: classes.{name}: not a host class (known: {known})")
    return given


def with_defaults(given: CostTable) -> CostTable:
    """The default classes, with those `given` names over them."""
    return given.model_copy(update={"classes": {**DEFAULT_CLASSES, **given.classes}})


def load_cost_table(path: Path) -> CostTable:
    """The defaults, with the file's electricity price and the classes it names over them."""
    return with_defaults(read_cost_file(path))
