"""Local S3 servers (MiniStack, moto) for tests: the launchers of `chaos.s3_server`.

One home for them: ``lm-chaos`` needs them at run time and cannot import ``tests``, so
they live in the installed ``chaos`` package and tests (and benchmarks) import them
through here. Every server listens on 127.0.0.1 on a free port and is stopped by its PID;
see `chaos.s3_server` for the contract.
"""

from __future__ import annotations

from chaos.s3_server import (
    AWS_ENV_TO_REMOVE,
    CREDENTIALS,
    REGION,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    RunningServer,
    ServerStartError,
    create_bucket,
    dummy_aws_env,
    fresh_bucket,
    start_ministack,
    start_moto,
    unique_bucket_name,
)

# The names tests and benchmarks already use for the dummy credentials and region.
TEST_CREDENTIALS = CREDENTIALS
TEST_REGION = REGION

__all__ = [
    "AWS_ENV_TO_REMOVE",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "TEST_CREDENTIALS",
    "TEST_REGION",
    "RunningServer",
    "ServerStartError",
    "create_bucket",
    "dummy_aws_env",
    "fresh_bucket",
    "start_ministack",
    "start_moto",
    "unique_bucket_name",
]
