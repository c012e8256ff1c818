"""``bertcf.flow.Glow``, as earlier versions named it: the flow is ``bertcf.models.flow``."""
from .models.flow import *  # noqa: F401,F403
