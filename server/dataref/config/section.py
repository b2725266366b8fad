"""What every settings section is."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section: unknown keys are mistakes, refused rather than ignored."""

    model_config = ConfigDict(extra="forbid")
