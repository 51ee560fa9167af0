"""Ray Data entry points (`pip install 'specctl[ray]'`): GenerateBatches, the callable class for
`ds.map_batches` (see docs/commands.md, "Across processes and machines")."""

from specctl.runtime.jobs.ray_pool import GenerateBatches

__all__ = ["GenerateBatches"]
