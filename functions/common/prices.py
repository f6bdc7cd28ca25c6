"""What SageMaker training instances cost per hour: the one table the advisor and messages use.

On-demand list prices per instance-hour of SageMaker *training* instances in US East (N.
Virginia), USD, written down by hand from AWS's pricing page (not fetched live: Lambdas have no
pricing API call to make, and the page is not an API). Prices change and differ by region, so
every figure made from this table is called an estimate and names its source.
"""

from __future__ import annotations

PRICES_SOURCE = (
    "AWS SageMaker AI pricing page, On-Demand, Training, US East (N. Virginia): "
    "https://aws.amazon.com/sagemaker/pricing/"
)
PRICES_AS_OF = "the 2024-2025 listing, written down by hand, not fetched live"

TRAINING_PRICE_PER_HOUR: dict[str, float] = {
    # 8-GPU hosts (what data-parallel jobs run on)
    "ml.p3.16xlarge": 28.152,
    "ml.p4d.24xlarge": 37.688,
    "ml.p4de.24xlarge": 47.110,
    "ml.p5.48xlarge": 113.068,
    "ml.g5.48xlarge": 20.360,
    "ml.g6e.48xlarge": 37.664,
    # smaller GPU hosts
    "ml.g5.xlarge": 1.408,
    "ml.g5.2xlarge": 1.515,
    "ml.g5.4xlarge": 2.030,
    "ml.g5.8xlarge": 3.060,
    "ml.g5.12xlarge": 7.090,
    "ml.g5.24xlarge": 10.180,
    # CPU hosts
    "ml.m5.large": 0.115,
    "ml.m5.xlarge": 0.230,
    "ml.m5.2xlarge": 0.461,
    "ml.c5.xlarge": 0.204,
    "ml.c5.2xlarge": 0.408,
}


def estimated_cost(instance_type: str, billable_seconds: float) -> float | None:
    """USD for `billable_seconds` of instance time (SageMaker's BillableTimeInSeconds, which
    already counts spot savings), or None when the table has no price for the type."""
    price = TRAINING_PRICE_PER_HOUR.get(instance_type)
    return None if price is None else price * billable_seconds / 3600.0
