"""edgefleet fleet."""
