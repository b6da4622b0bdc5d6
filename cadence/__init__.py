"""cadence."""
