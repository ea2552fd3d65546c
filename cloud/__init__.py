"""edgefleet cloud."""
