"""edgefleet edge."""
