"""Machinery every part uses: atomic file writes, device and precision, processes
(torch.distributed) and progress output."""
