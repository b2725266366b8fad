"""A SQL source's settings (``[sources.NAME]``): kind, connection, roles, caps, budget.

Part of the settings package: ``password()`` is one of the package's reads of the
environment (``password_env``), which nothing outside it does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from .section import Section


class SourceSettings(Section):
    kind: Literal["sqlite", "postgres", "duckdb"] | None = Field(
        None,
        description="sqlite (a file), postgres (a server) or duckdb (a directory of "
        "Parquet/CSV/JSON files); default: postgres when url is set, else sqlite.",
    )
    path: Path | None = Field(
        None, description="SQLite: the database file (opened read-only). DuckDB: the directory."
    )
    url: str | None = Field(
        None,
        description="PostgreSQL: libpq URL or conninfo of the login role (no password in it).",
    )
    password_env: str | None = Field(
        None, description="PostgreSQL: environment variable holding the login's password."
    )
    password_file: Path | None = Field(
        None, description="PostgreSQL: file holding the login's password."
    )
    roles: dict[str, str] = Field(
        default_factory=dict,
        description="PostgreSQL: database role each owner's queries run as ({owner: role}, "
        "'*' for everyone else); owners without one are refused.",
    )
    sensitive: bool = Field(
        False, description="Descriptions of data from this source carry no sample rows."
    )
    owners: list[str] = Field(
        default_factory=lambda: ["*"], description="Owners allowed to query it ('*' = everyone)."
    )
    row_cap: int = Field(2_000_000, ge=1, description="Queries returning more rows are refused.")
    timeout_seconds: float = Field(10, gt=0, description="Statement timeout.")
    model_bytes_per_day: int | None = Field(
        None,
        ge=1,
        description="Bytes of tool replies from this source one owner may receive per UTC day "
        "(the exposure ledger counts them); once spent, its tools refuse until midnight UTC.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SourceSettings:
        if self.kind is None:
            self.kind = "postgres" if self.url is not None else "sqlite"
        postgres_only = {
            "url": self.url, "password_env": self.password_env,
            "password_file": self.password_file, "roles": self.roles or None,
        }  # fmt: skip
        if self.kind == "postgres":
            if not self.url or self.path is not None:
                raise ValueError("a postgres source needs url (and no path)")
            if not self.roles:
                raise ValueError("a postgres source needs roles = {owner = role, ...}")
            if self.password_env and self.password_file:
                raise ValueError("give password_env or password_file, not both")
        else:
            if self.path is None:
                raise ValueError(f"a {self.kind} source needs path")
            extra = sorted(k for k, v in postgres_only.items() if v is not None)
            if extra:
                raise ValueError(f"{', '.join(extra)} apply to postgres sources only")
        return self

    def role_for(self, owner: str) -> str | None:
        """The database role ``owner`` queries as (postgres), None when unmapped."""
        return self.roles.get(owner, self.roles.get("*"))

    def password(self) -> str | None:
        """The login's password from password_env or password_file (never logged)."""
        if self.password_env:
            return os.environ.get(self.password_env)
        if self.password_file:
            return self.password_file.read_text().strip()
        return None
