"""`[plugins.engine-diffusers]` in a profile: where the diffusers folders are, and the request bounds."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PLUGIN = "engine-diffusers"


class DiffusersConfig(BaseModel):
    """Every field has a default, so the plugin works without a table."""

    model_config = ConfigDict(extra="forbid")
    model_dirs: list[str] = Field(
        default_factory=list,
        description="folders whose sub-folders are diffusers pipelines (a model_index.json each); "
        "each becomes a card named after the folder",
    )
    threads: int = Field(
        default=1,
        ge=0,
        description="CPU threads torch uses in the runner (0: torch's default, every core). 1 by default: on a "
        "small shared box two OpenMP threads spin against other processes and run several times slower",
    )
    max_n: int = Field(default=4, ge=1, le=10, description="images per request (OpenAI allows 1-10)")
    max_pixels: int = Field(default=1024 * 1024, ge=64 * 64, description="width x height of one image, at most")
    max_image_bytes: int = Field(default=32 * 2**20, ge=2**16, description="bytes of one made image, at most")
    max_upload_bytes: int = Field(default=16 * 2**20, ge=2**16, description="bytes of an edit's input image")
    upload_timeout_s: float = Field(default=60.0, gt=0, description="how long a runner waits for an input image")
    url_ttl_s: float = Field(default=3600.0, gt=0, description="how long a response_format=url file is served")
    url_store_bytes: int = Field(default=256 * 2**20, ge=2**20, description="bytes of url files kept in memory")


def from_options(options: dict[str, object]) -> DiffusersConfig:
    """The runner's typed copy of the table (RunnerSpec.options is the node's validated table)."""
    return DiffusersConfig.model_validate(dict(options))
