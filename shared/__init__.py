"""The core both edge and cloud import: contracts, input adaptation, execution."""
