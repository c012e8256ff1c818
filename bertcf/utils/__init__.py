"""Machinery every part uses: atomic file writes, device and precision, processes
(torch.distributed), progress output, one process per directory (lock) and what a result ran
with (environment)."""
