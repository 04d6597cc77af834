"""rollup package."""
