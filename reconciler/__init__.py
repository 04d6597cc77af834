"""reconciler package."""
