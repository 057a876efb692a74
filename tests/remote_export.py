"""The small export the remote-read tests share, served by a real moto S3 server behind the fault proxy.

Import both fixtures into a test module (`from remote_export import exported, s3`); each module gets
its own export and server (module scope), so one module's faults or uploads never reach another's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from exports import export_synthetic
from fault_proxy import FaultProxy, s3_behind_proxy


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """36 samples in 5 shards of at most 8 (3 episodes, stride 8), no image member."""
    return export_synthetic(tmp_path_factory.mktemp("remote"), 3, 2, "--stride", "8",
                            "--set", "shard.max_samples=8", "--set", "shard.min_shards=1",
                            "--set", "exclude=[overview]")


@pytest.fixture(scope="module")
def s3(exported: Path) -> Iterator[tuple[FaultProxy, dict[str, Any]]]:
    """(proxy, storage_options): the export at s3://robots/ds/, reached through the proxy."""
    with s3_behind_proxy({"ds": exported}) as (proxy, options):
        yield proxy, options
