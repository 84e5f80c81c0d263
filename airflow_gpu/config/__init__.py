"""The quota configuration: GPU products, tiers and teams, read from YAML and validated with pydantic.

The scheduler, the simulator, the pool manager and the operator all read the same `QuotaConfig`:

    from airflow_gpu.config import load_config, SLOTS_PER_GPU
    cfg = load_config("examples/seed-quotas.yaml")
    cfg.team("vision").quota_gpus("a100-80gb")          # 8
    cfg.pool_slots("a100-80gb", gpus=2)                  # 14: Airflow pool_slots of a 2-GPU task
    cfg.pool_slots("a100-80gb", mig_profile="1g.10gb")   # 1

Loading is all or nothing: `load_config` raises `ConfigError` listing every problem as
`file: field.path: what is wrong (what is allowed)`; nothing is returned and nothing is changed.
"""

from airflow_gpu.config.errors import ConfigError, ConfigIssue
from airflow_gpu.config.load import load_config, load_config_cached, parse_config
from airflow_gpu.config.model import (
    format_gpus,
    SLOTS_PER_GPU,
    GpuProduct,
    MigProfile,
    Price,
    QuotaConfig,
    Team,
    Tier,
)

__all__ = [
    "SLOTS_PER_GPU",
    "format_gpus",
    "ConfigError",
    "ConfigIssue",
    "GpuProduct",
    "MigProfile",
    "Price",
    "QuotaConfig",
    "Team",
    "Tier",
    "load_config",
    "load_config_cached",
    "parse_config",
]
