"""Settings: one object, read once (TOML file + DATAREF_* env vars), then passed in.

Nothing outside this package reads ``os.environ``; the CLI builds a ``Settings`` and hands it
to the app, which hands the pieces to the store, the pool and the producers. A SQL source's
settings, its checks and its password look-up are ``sources.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from .section import Section
from .sources import SourceSettings

MiB = 1024 * 1024
GiB = 1024 * MiB


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "dataref"


class StoreSettings(Section):
    ttl_seconds: int = Field(
        86400, ge=1, description="How long an artifact lives after it is created."
    )
    artifact_max_bytes: int = Field(
        256 * MiB, ge=1, description="Byte cap for one artifact (Arrow IPC size on disk)."
    )
    owner_quota_bytes: int = Field(
        2 * GiB, ge=1, description="Total bytes of live artifacts one owner may hold."
    )
    sweep_interval_seconds: int = Field(
        60, ge=1, description="How often expired artifacts and downloads are deleted."
    )
    blobs: str | None = Field(
        None,
        description="Where artifact and export bytes live: unset = the state dir; "
        "'file:///shared/dir' (a directory every replica mounts) or 's3://bucket/prefix'.",
    )
    s3_endpoint: str | None = Field(
        None, description="S3 API endpoint URL (unset: AWS; credentials from AWS_* env vars)."
    )
    s3_region: str | None = Field(None, description="S3 region (unset: AWS_REGION or default).")
    s3_access_key: str | None = Field(
        None, description="S3 access key (unset: AWS_ACCESS_KEY_ID / instance role)."
    )
    s3_secret_key: str | None = Field(
        None, description="S3 secret key (unset: AWS_SECRET_ACCESS_KEY / instance role)."
    )


class StateSettings(Section):
    url: str | None = Field(
        None,
        description="PostgreSQL URL (postgresql://...) of the shared state for replicas; "
        "unset: SQLite files under state_dir (one machine).",
    )
    pool_size: int = Field(20, ge=2, description="PostgreSQL connections per server process.")
    lock_timeout_seconds: float = Field(
        900, gt=0, description="How long a call waits for the call before it on its notebook."
    )


class DescribeSettings(Section):
    sample_rows: int = Field(5, ge=0, le=50, description="Sample rows in a producer's Description.")
    output_sample_rows: int = Field(
        3, ge=0, le=50, description="Sample rows in the Description of a run_python output."
    )


class ComputeSettings(Section):
    result_max_bytes: int = Field(
        4096, ge=64, description="Cap on the JSON `result` of run_python."
    )
    stdout_max_bytes: int = Field(
        2048,
        ge=64,
        description="stdout/stderr returned to the agent beyond this are cut, with a note.",
    )
    default_timeout_seconds: float = Field(
        120, gt=0, description="Timeout of a run_python call when the agent gives none."
    )
    max_timeout_seconds: float = Field(
        900, gt=0, description="Largest timeout_s an agent may ask for."
    )
    interrupt_grace_seconds: float = Field(
        5,
        gt=0,
        description="After a timeout's interrupt, how long to wait before restarting the kernel.",
    )
    progress_interval_seconds: float = Field(
        5, gt=0, description="How often a long call sends an MCP progress notification."
    )


class KernelSettings(Section):
    sandbox: Literal["auto", "uid", "userns", "bwrap", "unsandboxed"] = Field(
        "auto",
        description="How kernels are sandboxed (bubblewrap in every mode but 'unsandboxed'). "
        "'auto': 'uid' when the server runs as root, else 'userns'. 'uid' (alias 'bwrap'): "
        "root server, one host uid per kernel. 'userns': any user, one user namespace per "
        "kernel, plus Landlock where the kernel has it. 'unsandboxed' runs agent code as the "
        "server's own user with no isolation; only for trusted single-user development.",
    )
    memory_bytes: int = Field(3 * GiB, ge=256 * MiB, description="RLIMIT_AS of a kernel.")
    max_processes: int = Field(
        64, ge=16, description="RLIMIT_NPROC of a kernel's uid (threads count)."
    )
    max_open_files: int = Field(1024, ge=64, description="RLIMIT_NOFILE of a kernel.")
    max_file_bytes: int = Field(
        1 * GiB, ge=MiB, description="RLIMIT_FSIZE: largest file a kernel writes."
    )
    tmp_bytes: int = Field(
        256 * MiB, ge=MiB, description="Size of the kernel's private /tmp tmpfs."
    )
    shm_bytes: int = Field(
        64 * MiB, ge=MiB, description="Size of the kernel's private /dev/shm tmpfs."
    )
    work_bytes: int = Field(
        512 * MiB,
        ge=16 * MiB,
        description="Size of the kernel's private /sandbox tmpfs: all it may write there.",
    )
    memory_budget_bytes: int | None = Field(
        None,
        ge=256 * MiB,
        description="Kernels (spares included) start only while the sum of their memory_bytes, "
        "tmp_bytes, shm_bytes and work_bytes fits this. None: 75% of the machine's RAM.",
    )
    uid_base: int = Field(
        61000, ge=1000, description="First host uid given to kernels; each kernel gets its own uid."
    )
    uid_count: int = Field(1000, ge=1, description="How many uids from uid_base kernels may use.")
    cpu_seconds: int = Field(
        3600, ge=10, description="RLIMIT_CPU: lifetime CPU budget of a kernel."
    )
    warm_spares: int = Field(1, ge=0, le=16, description="Kernels kept started and unassigned.")
    idle_timeout_seconds: float = Field(
        1800,
        gt=0,
        description="A notebook's kernel idle this long is shut down (its transcript stays).",
    )
    max_per_owner: int = Field(4, ge=1, description="Live kernels one owner may hold.")
    max_total: int = Field(16, ge=1, description="Live kernels the server holds in all.")
    startup_timeout_seconds: float = Field(
        60, gt=0, description="How long a kernel may take to start."
    )
    gateway_url: str | None = Field(
        None,
        description="Run kernels on this Jupyter Kernel Gateway or Enterprise Gateway "
        "(http(s)://host:port) instead of this machine; see README 'Kernels on a gateway'.",
    )
    gateway_token: str | None = Field(
        None, description="The gateway's auth token (KG_AUTH_TOKEN / EG_AUTH_TOKEN)."
    )
    gateway_kernel: str = Field(
        "dataref",
        description="Kernelspec the gateway launches (`dataref kernelspec install` on its host).",
    )


class AuthSettings(Section):
    tokens: dict[str, str] = Field(
        default_factory=dict, description="Static bearer tokens for HTTP: {token: owner}."
    )
    jwks_uri: str | None = Field(None, description="JWKS URL for JWT bearer tokens over HTTP.")
    issuer: str | None = Field(None, description="Required `iss` of JWT bearer tokens.")
    audience: str | None = Field(None, description="Required `aud` of JWT bearer tokens.")
    algorithm: str = Field("RS256", description="JWT signing algorithm.")
    public_key: str | None = Field(
        None, description="PEM public key (or HS shared secret) instead of jwks_uri."
    )


class DemoSettings(Section):
    enabled: bool = Field(True, description="Create and serve the demo sales database.")
    grants: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Regions each owner may see in the demo source: {owner: [region, ...]}. "
        "Owners not listed see every region.",
    )
    sensitive: bool = Field(False, description="Treat the demo source as sensitive (no samples).")
    model_bytes_per_day: int | None = Field(
        None, ge=1, description="Daily budget per owner of the demo source, as for [sources.NAME]."
    )


class ServerSettings(Section):
    host: str = Field("127.0.0.1", description="HTTP bind address.")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port.")
    public_url: str | None = Field(
        None, description="Base URL clients reach the server at; download links start with it."
    )
    download_ttl_seconds: int = Field(3600, ge=1, description="How long a download link works.")


class MetricsSettings(Section):
    token: str | None = Field(
        None,
        description="Bearer token of GET /metrics (Prometheus text) on the HTTP server; "
        "unset: /metrics answers 404.",
    )


class LogSettings(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Level of the JSON log lines on stderr (audit events are WARNING)."
    )


class ProducerSettings(Section):
    plugins: list[str] = Field(
        default_factory=list,
        description="Extra producer modules to import ('package.module'); their @producer "
        "functions become tools. Entry points in the group 'dataref.producers' load too.",
    )


class ChartSettings(Section):
    max_png_bytes: int = Field(
        64 * 1024, ge=8 * 1024, description="Upper bound of a chart PNG returned to the agent."
    )
    width_px: int = Field(800, ge=200, le=2000, description="Chart width in pixels.")
    height_px: int = Field(450, ge=150, le=1500, description="Chart height in pixels.")
    max_categories: int = Field(
        30, ge=2, description="Bar charts show the top N categories, with a note."
    )


class PageSettings(Section):
    enabled: bool = Field(
        True, description="Serve the page for people (/, /notebooks, /artifacts) over HTTP."
    )
    session_ttl_seconds: int = Field(
        8 * 3600, ge=60, description="How long a page sign-in (its session cookie) lasts."
    )


class Settings(BaseSettings):
    """Every setting of dataref. TOML sections match the nested models below."""

    model_config = SettingsConfigDict(
        env_prefix="DATAREF_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    state_dir: Path = Field(
        default_factory=default_state_dir,
        description="Where artifacts, notebooks and kernels live.",
    )
    owner: str | None = Field(
        None, description="Owner over stdio; defaults to the local user name."
    )
    store: StoreSettings = Field(default_factory=StoreSettings)
    state: StateSettings = Field(default_factory=StateSettings)
    describe: DescribeSettings = Field(default_factory=DescribeSettings)
    compute: ComputeSettings = Field(default_factory=ComputeSettings)
    kernels: KernelSettings = Field(default_factory=KernelSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    sources: dict[str, SourceSettings] = Field(
        default_factory=dict, description="Read-only SQL sources for fetch_sql: {name: {...}}."
    )
    demo: DemoSettings = Field(default_factory=DemoSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    producers: ProducerSettings = Field(default_factory=ProducerSettings)
    charts: ChartSettings = Field(default_factory=ChartSettings)
    page: PageSettings = Field(default_factory=PageSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    logs: LogSettings = Field(default_factory=LogSettings)

    # Set by load_settings(): the TOML file to read, if any.
    _toml_file: Path | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = _CONFIG_FILE.get("path")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)

    @property
    def demo_db_path(self) -> Path:
        return self.state_dir / "demo" / "sales.sqlite"

    def all_sources(self) -> dict[str, SourceSettings]:
        """Configured SQL sources plus the demo database (as source 'demo') when enabled."""
        sources = dict(self.sources)
        if self.demo.enabled and "demo" not in sources:
            sources["demo"] = SourceSettings(path=self.demo_db_path, sensitive=self.demo.sensitive)
        return sources


# pydantic-settings decides its sources per class, so the file path is handed over here,
# for the duration of one load_settings() call.
_CONFIG_FILE: dict[str, Path | None] = {"path": None}


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from (highest first) overrides, DATAREF_* env vars, then the TOML file.

    The TOML file is ``config_file`` or, when omitted, ``$DATAREF_CONFIG``.
    """
    path = config_file or os.environ.get("DATAREF_CONFIG")
    if path is not None and not Path(path).is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    _CONFIG_FILE["path"] = Path(path) if path else None
    try:
        return Settings(**overrides)
    finally:
        _CONFIG_FILE["path"] = None


def local_user() -> str:
    """The OS user name, the owner over stdio unless settings.owner says otherwise."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return f"uid{os.getuid()}"


def settings_reference() -> list[tuple[str, str, str]]:
    """(dotted key, default, description) for every setting: the README's table is made from it."""
    rows: list[tuple[str, str, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, f"{prefix}{name}.")
                continue
            if field.is_required():
                default: Any = "(required)"
            elif field.default_factory is not None:
                default = field.default_factory()  # type: ignore[call-arg]
            else:
                default = field.default
            if prefix == "" and name == "sources":
                rows.append(("sources", "{}", field.description or ""))
                walk(SourceSettings, "sources.<name>.")
                continue
            if prefix == "" and name == "state_dir":
                default = "~/.local/state/dataref"
            rows.append((prefix + name, repr(default), field.description or ""))

    walk(Settings, "")
    return rows
