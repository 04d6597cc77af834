"""demo package."""
