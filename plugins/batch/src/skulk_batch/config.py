"""`[plugins.batch]` in a profile: the bounds of files and batches and how hard batch work pushes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PLUGIN = "batch"
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")


class BatchConfig(BaseModel):
    """Every field has a default, so the plugin works without a table."""

    model_config = ConfigDict(extra="forbid")
    max_file_bytes: int = Field(default=64 << 20, gt=0, description="largest upload to /v1/files (413 beyond)")
    max_lines: int = Field(default=50_000, gt=0, description="most requests in one batch input file (OpenAI's bound)")
    max_line_bytes: int = Field(
        default=1 << 20, gt=0, description="longest JSONL line (its line goes to the error file)"
    )
    max_files: int = Field(default=1000, gt=0, description="most files the cluster keeps (400 beyond: delete some)")
    per_replica: int = Field(
        default=2,
        ge=1,
        description="batch lines in flight per ready replica of a line's model while no other task is",
    )
    busy_in_flight: int = Field(
        default=0,
        ge=0,
        description="batch lines in flight per model while interactive requests are open on its replicas "
        "(0: batch work waits until they are done, but for max_wait_s)",
    )
    max_wait_s: float = Field(
        default=30.0,
        gt=0,
        description="a batch that answered no line this long runs one line even while users are served",
    )
    quiet_s: float = Field(
        default=3.0,
        ge=0,
        description="after interactive requests were last seen, batch work stays stepped down this long",
    )
    segment_lines: int = Field(default=16, ge=1, description="results recorded through the master in one step")
    segment_s: float = Field(default=2.0, gt=0, description="... or after this long, whichever comes first")
    copies: int = Field(default=2, ge=1, description="nodes that hold each file and each result segment")
    line_attempts: int = Field(default=8, ge=1, description="tries of a line that answers 429 or 5xx before it fails")
    keeper_interval_s: float = Field(default=0.5, gt=0, description="how often nodes look for batches to run")
    files_dir: str = Field(default="", description="where files live (default: <home>/batch)")
