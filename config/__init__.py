"""Typed settings for every Lightmetrics process: defaults → TOML file → environment.

Only this package reads configuration files and environment variables; it imports nothing
of this project (every other package may import it). Entry points do::

    settings = load_settings(args.config)          # SettingsError: print it, exit 2
    configure_logging(settings.logging)
    tokens = load_tokens(settings.auth.tokens_file) if settings.auth.tokens_file else None
"""

from config.errors import SettingsError, SettingsProblem
from config.loader import load_settings
from config.logging import configure_logging
from config.settings import (
    AuthSettings,
    GcSettings,
    HttpSettings,
    IngestSettings,
    LoggingSettings,
    MetricsSettings,
    QuerySettings,
    ReceiverSettings,
    ReconcilerSettings,
    RetentionSettings,
    RollupSettings,
    ScrapeSettings,
    ScrapeTarget,
    Settings,
    StoreSettings,
)
from config.store_url import FileLocation, MemoryLocation, S3Location, StoreLocation
from config.tokens import (
    GeneratedToken,
    Principal,
    TokenTable,
    generate_token,
    hash_token,
    load_tokens,
    principal_toml,
)

__all__ = [
    "AuthSettings",
    "FileLocation",
    "GcSettings",
    "GeneratedToken",
    "HttpSettings",
    "IngestSettings",
    "LoggingSettings",
    "MemoryLocation",
    "MetricsSettings",
    "Principal",
    "QuerySettings",
    "ReceiverSettings",
    "ReconcilerSettings",
    "RetentionSettings",
    "RollupSettings",
    "S3Location",
    "ScrapeSettings",
    "ScrapeTarget",
    "Settings",
    "SettingsError",
    "SettingsProblem",
    "StoreLocation",
    "StoreSettings",
    "TokenTable",
    "configure_logging",
    "generate_token",
    "hash_token",
    "load_settings",
    "load_tokens",
    "principal_toml",
]
