"""dataref: pass references, not rows. An MCP server for analysing data by reference."""

from .config import Settings, load_settings
from .errors import DatarefError

__version__ = "0.1.0"

__all__ = ["DatarefError", "Settings", "__version__", "load_settings"]
