"""`[plugins.api-media]`: the job store's limits (every field has a default)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PLUGIN = "api-media"


class MediaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_ttl_s: float = Field(default=24 * 3600.0, gt=0, description="jobs and their files expire after this")
    sweep_interval_s: float = Field(default=60.0, gt=0, description="how often expired jobs are removed")
    max_jobs: int = Field(default=64, ge=1, description="jobs one API node holds (oldest finished ones go first)")
    max_active_jobs: int = Field(default=8, ge=1, description="queued or running jobs at once; more is a 429")
    max_video_bytes: int = Field(default=512 * 1024 * 1024, ge=1, description="largest MP4 a job may assemble")
    max_input_bytes: int = Field(default=20 * 1024 * 1024, ge=1, description="largest input_reference image")
    jobs_dir: str = Field(default="", description="where finished files live (default: <home>/api-media/videos)")
