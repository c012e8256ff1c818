"""Where checkpoints written before 2026-11-24 find their flow module: their ``modules.json`` names
``bertcf.st.Flow``. The module is ``bertcf.models.st_flow``."""
from .models.st_flow import Flow

__all__ = ["Flow"]
