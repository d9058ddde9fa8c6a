"""What an hour of each host class costs: amortized hardware price plus energy.

cost of a condition = sum over hosts of hours_h * (price_per_hour + power_w / 1000 * kwh_price),
where hours_h is the host's own measured span (its clock). Power is the host's measured mean
power where it reports one (tegrastats, nvidia-smi), else the class's nominal figure.
The defaults are planning figures (list prices over three years of continuous use); give your
own with a YAML file of the same shape (`testbed report RUN --costs FILE`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class HostCost(BaseModel):
    model_config = ConfigDict(extra="forbid")

    price_per_hour: float = Field(ge=0, description="amortized hardware price, USD per hour")
    power_w: float = Field(ge=0, description="nominal power draw under load, W")


class CostTable(BaseModel):
    """Per-host-class costs and the electricity price."""

    model_config = ConfigDict(extra="forbid")

    kwh_price: float = Field(0.30, ge=0, description="electricity, USD per kWh")
    classes: dict[str, HostCost] = Field(
        default_factory=lambda: {
            "pi5": HostCost(price_per_hour=80 / 26280, power_w=8),
            "jetson-orin-nano": HostCost(price_per_hour=500 / 26280, power_w=15),
            "a100": HostCost(price_per_hour=15000 / 26280, power_w=400),
            "cpu-server": HostCost(price_per_hour=3000 / 26280, power_w=150),
        }
    )

    def hourly(self, host_class: str, power_w: float | None = None) -> float | None:
        """USD per hour of one host of this class; None for a class not in the table."""
        cost = self.classes.get(host_class)
        if cost is None:
            return None
        watts = cost.power_w if power_w is None else power_w
        return cost.price_per_hour + watts / 1000 * self.kwh_price


def load_cost_table(path: Path) -> CostTable:
    from testbed.config.loading import load_model

    return load_model(CostTable, path)
