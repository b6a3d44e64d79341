"""Data files of the twin (JSON, each naming its source); read through controlplane.sim.hardware."""
